# cython: language_level=3
"""The usage series' per-request counting in C: one pass over a request's results (the
pure-Python twin is `gateway.usage_series._count_one_py`; `tests/property/
test_usagecount_agree.py` checks they agree). A 1,000-op request cost the event loop
~0.2 ms in map/itemgetter passes with the GIL held, which the bulk load felt."""


def count_one(list ops, list results, object written, object deleted, object duplicate):
    """(writes, bytes written (key + value of each written op), deletes, duplicates) of
    `ops` and their `results` (tuples whose first item is the status)."""
    cdef Py_ssize_t i, n = len(results)
    cdef Py_ssize_t w = 0, d = 0, dup = 0
    cdef long long bw = 0
    cdef object st, item
    if len(ops) != n:
        raise ValueError("ops and results differ in length")
    for i in range(n):
        item = results[i]
        if not isinstance(item, tuple):  # PyTuple_Check: NamedTuples are tuples
            raise TypeError("a result must be a tuple")
        st = (<tuple>item)[0]
        # Status members are singletons: identity first, equality for anything else.
        if st is written or (st is not deleted and st is not duplicate and st == written):
            w += 1
            item = ops[i]
            if not isinstance(item, tuple):
                raise TypeError("an op must be a tuple")
            bw += len((<tuple>item)[1]) + len((<tuple>item)[2])
        elif st is deleted or st == deleted:
            d += 1
        elif st is duplicate or st == duplicate:
            dup += 1
    return w, bw, d, dup
