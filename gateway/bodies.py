"""Request bodies and keys: JSON and msgpack batches decoded into store ops, with limits.

Pure functions of bytes; every refusal is a BadRequestError (400) or TooLargeError (413)
whose message names the exact reason (op index, field, limit).
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote_to_bytes

import msgpack
import orjson

from core import compiled, strictjson, ttl
from core.errors import BadRequestError, TooLargeError
from store.ops import DELETE, SET, Op

#: The compiled decoder of common JSON batch bodies (`gateway/_jsonops.pyx`), or None where
#: its pure twin serves (`core/compiled.py`: ``MERCURY_PURE=1``, or before `make build`);
#: `batch_body_ops` then takes the reference.
_jsonops = compiled.load("gateway._jsonops")
_fast_json: Callable[[bytes, str, int, int, int], tuple[list[Op], int] | None] | None = (
    None if _jsonops is None else _jsonops.decode_json_ops
)

MSGPACK = "application/msgpack"
_new = tuple.__new__
_MSGPACK_TYPES = ("application/msgpack", "application/x-msgpack", "application/vnd.msgpack")


def is_msgpack(content_type: str | None) -> bool:
    """Whether a Content-Type names msgpack."""
    if not content_type:
        return False
    return content_type.split(";", 1)[0].strip().lower() in _MSGPACK_TYPES


def key_from_path(raw: bytes, max_key: int) -> bytes:
    """The key of a ``/v1/kv/{key}`` path tail (percent-decoded bytes), length-checked."""
    key = unquote_to_bytes(raw)
    check_key(key, max_key)
    return key


def check_key(key: bytes, max_key: int, where: str = "key") -> None:
    """Raise when `key` is empty (400) or longer than `max_key` bytes (413)."""
    if not key:
        raise BadRequestError(f"{where} is empty; keys are 1 to {max_key} bytes")
    if len(key) > max_key:
        raise TooLargeError(f"{where} is {len(key)} bytes; keys are at most {max_key} bytes")


def parse_body(body: bytes, content_type: str | None) -> Any:
    """Decode a JSON or msgpack body (400 with the parser's reason when it is not, and
    when an object or map repeats a member name, `core/strictjson.py`)."""
    if is_msgpack(content_type):
        try:
            return msgpack.unpackb(
                body, raw=False, strict_map_key=False, object_pairs_hook=strictjson.unique_map
            )
        except strictjson.AmbiguousJsonError as err:
            raise ambiguous(err) from err
        except Exception as err:  # msgpack raises several unrelated classes
            raise BadRequestError(f"body is not valid msgpack: {err}") from err
    try:
        return strictjson.loads(body)
    except orjson.JSONDecodeError as err:
        raise BadRequestError(f"body is not valid JSON: {err}") from err
    except strictjson.AmbiguousJsonError as err:
        raise ambiguous(err) from err


def ambiguous(err: strictjson.AmbiguousJsonError) -> BadRequestError:
    """The 400 of a JSON body with a repeated member name (`core/strictjson.py`): the
    status and problem type of a body that is not JSON, naming the member."""
    return BadRequestError(f"body is refused: {err}")


def batch_body_ops(
    body: bytes,
    content_type: str | None,
    owner: str,
    *,
    max_ops: int,
    max_key: int,
    max_value: int,
) -> tuple[list[Op], int]:
    """Ops of a ``/v1/batch`` body and their key + value bytes, validated.

    JSON bodies of the common shape go through the compiled decoder; everything else, and
    every body it declines, through the reference `parse_body` + `batch_ops`, which gives
    the same ops or the exact reason for refusing.
    """
    if _fast_json is not None and not is_msgpack(content_type):
        fast = _fast_json(body, owner, max_ops, max_key, max_value)
        if fast is not None:
            return fast
    return reference_batch_body_ops(
        body, content_type, owner, max_ops=max_ops, max_key=max_key, max_value=max_value
    )


def reference_batch_body_ops(
    body: bytes,
    content_type: str | None,
    owner: str,
    *,
    max_ops: int,
    max_key: int,
    max_value: int,
) -> tuple[list[Op], int]:
    """`batch_body_ops` in pure Python: the behaviour the compiled decoder must match."""
    doc = parse_batch_body(body, content_type, max_ops, max_key, max_value)
    ops = batch_ops(doc, owner, max_ops=max_ops, max_key=max_key, max_value=max_value)
    nbytes = 0
    for op in ops:
        nbytes += len(op.key) + len(op.value)
    return ops, nbytes


# --- structure bounds while decoding ----------------------------------------------------
#
# A decoded body costs ~60 bytes per container: a 40 MiB msgpack array of empty maps was
# 3 GB of dicts before any op count applied. A batch body is ``{"ops": [op, ...]}`` whose
# ops are objects of scalars, so it has at most `max_ops` + 1 objects, one array and a
# depth of 3; anything more is refused while (msgpack) or before (JSON) it is decoded,
# which keeps a request's decoding within a small multiple of its body size.

#: Largest nesting of a batch body: the document, its ops array, an op.
MAX_DEPTH = 3
#: Most members an object of a batch body may have (an op has at most 7 fields).
MAX_MEMBERS = 16
# A JSON string (escapes included) or one bracket, for the exact structure scan.
_JSON_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')


def _too_many_ops(max_ops: int) -> TooLargeError:
    return TooLargeError(
        f"batch body holds more than {max_ops} ops (or objects); at most {max_ops} per request",
        max_ops=max_ops,
    )


def _too_deep() -> BadRequestError:
    return BadRequestError(
        'a batch body is {"ops": [op, ...]} with ops of strings, numbers and booleans; '
        "nested arrays or objects are refused"
    )


def check_json_structure(body: bytes, max_ops: int) -> None:
    """Refuse a JSON batch body with more containers than `max_ops` + 2 or nested deeper
    than `MAX_DEPTH`, before any of it is decoded.

    Counting brackets is C-speed and can only over-count (brackets inside strings), so
    a body under the bound is fine as it is; only above it are strings skipped exactly.
    """
    limit = max_ops + 2
    if body.count(b"{") + body.count(b"[") <= limit:
        return  # too few containers to cost anything (the op checks refuse bad shapes)
    depth = 0
    containers = 0
    for m in _JSON_TOKEN.finditer(body):
        c = m.group()[0]
        if c == 0x22:  # a string: skipped whole
            continue
        if c in (0x5B, 0x7B):  # [ {
            depth += 1
            containers += 1
            if depth > MAX_DEPTH:
                raise _too_deep()
            if containers > limit:
                raise _too_many_ops(max_ops)
        else:
            depth -= 1


def unpack_batch_msgpack(body: bytes, max_ops: int, max_key: int, max_value: int) -> Any:
    """Decode a msgpack batch body with every container counted as it completes: one
    array (the ops), at most `max_ops` + 1 maps of `MAX_MEMBERS` members, strings and
    binaries no longer than a value may be (base64 included); refused at the first
    container beyond that, so a hostile body is never decoded whole. A map naming a key
    twice is refused as a JSON object naming a member twice (`core/strictjson.py`)."""
    maps = 0
    arrays = 0

    def on_map(pairs: list[tuple[Any, Any]]) -> dict[Any, Any]:
        nonlocal maps
        maps += 1
        if maps > max_ops + 1:
            raise _too_many_ops(max_ops)
        return strictjson.unique_map(pairs)

    def on_array(a: list[Any]) -> list[Any]:
        nonlocal arrays
        arrays += 1
        if arrays > 1:
            raise _too_deep()
        return a

    longest = max(max_key, max_value)
    try:
        return msgpack.unpackb(
            body,
            raw=False,
            strict_map_key=False,
            object_pairs_hook=on_map,
            list_hook=on_array,
            max_array_len=max_ops,
            max_map_len=MAX_MEMBERS,
            max_str_len=longest * 4 // 3 + 4,  # a base64 value
            max_bin_len=longest,
            max_ext_len=0,
        )
    except (TooLargeError, BadRequestError):
        raise
    except strictjson.AmbiguousJsonError as err:
        raise ambiguous(err) from err
    except ValueError as err:
        if "max_array_len" in str(err):
            raise _too_many_ops(max_ops) from err
        if "max_map_len" in str(err):
            raise BadRequestError(f"an object of more than {MAX_MEMBERS} members") from err
        if "max_str_len" in str(err) or "max_bin_len" in str(err):
            raise TooLargeError(
                f"a string or binary longer than a value may be ({max_value} bytes)"
            ) from err
        raise BadRequestError(f"body is not valid msgpack: {err}") from err
    except Exception as err:  # msgpack raises several unrelated classes
        raise BadRequestError(f"body is not valid msgpack: {err}") from err


def parse_batch_body(
    body: bytes, content_type: str | None, max_ops: int, max_key: int, max_value: int
) -> Any:
    """`parse_body` for ``/v1/batch``: the same document, its structure bounded while
    decoding (`check_json_structure`, `unpack_batch_msgpack`)."""
    if is_msgpack(content_type):
        return unpack_batch_msgpack(body, max_ops, max_key, max_value)
    check_json_structure(body, max_ops)
    if len(body) > ORJSON_MAX_BODY:
        return loads_json_lean(body)
    return parse_body(body, content_type)


#: Largest JSON batch body decoded by orjson. orjson (yyjson) sizes its parse buffer
#: from the body's length — about 13 times the body at its peak, whatever the body holds —
#: so a larger body goes through the leaner `loads_json_lean` (about 2 times).
ORJSON_MAX_BODY = 1 << 20
# A surrogate code point: only a \u escape can put one in a decoded string (strict UTF-8
# decoding refuses them raw); orjson refuses such text, so the lean decoder does too.
_SURROGATE = re.compile("[\ud800-\udfff]")


def _has_surrogate(doc: Any) -> bool:
    """Whether any string of `doc` (keys included) holds a surrogate code point."""
    stack = [doc]
    while stack:
        x = stack.pop()
        if type(x) is str:
            if not x.isascii() and _SURROGATE.search(x):
                return True
        elif type(x) is dict:
            stack.extend(x.keys())
            stack.extend(x.values())
        elif type(x) is list:
            stack.extend(x)
    return False


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def loads_json_lean(body: bytes) -> Any:
    """The document orjson would give for `body`, decoded by the standard library's
    scanner (Python objects only, no body-sized parse buffer); the same refusals: invalid
    UTF-8, NaN/Infinity, lone surrogate escapes, integers beyond 64 bits, and (as
    `parse_body`) a member name repeated in an object."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as err:
        raise BadRequestError(f"body is not valid JSON: {err}") from err
    try:
        doc = json.loads(text, parse_constant=_no_constant, parse_int=_int64, parse_float=_finite)
    except ValueError as err:  # JSONDecodeError is a ValueError
        raise BadRequestError(f"body is not valid JSON: {err}") from err
    del text
    if _has_surrogate(doc):
        raise BadRequestError("body is not valid JSON: a lone surrogate escape")
    try:
        strictjson.check(body, doc)
    except strictjson.AmbiguousJsonError as err:
        raise ambiguous(err) from err
    return doc


def _finite(digits: str) -> float:
    x = float(digits)
    if math.isinf(x):
        raise ValueError("a number beyond a double's range")
    return x


def _int64(digits: str) -> int | float:
    """An integer as orjson reads it: exact within 64 bits, a double beyond."""
    if len(digits) <= 20:
        n = int(digits)
        if -(1 << 63) <= n < (1 << 64):
            return n
    return _finite(digits)


def _bytes_field(op: dict[str, Any], name: str, i: int, required: bool) -> bytes | None:
    """Field `name` or `name_b64` of op `i` as bytes (str → UTF-8, bytes as is)."""
    v = op.get(name)
    b64 = op.get(name + "_b64")
    if v is not None and b64 is not None:
        raise BadRequestError(f"op {i}: give {name!r} or {name + '_b64'!r}, not both")
    if v is not None:
        if isinstance(v, str):
            return v.encode("utf-8", "surrogatepass")
        if isinstance(v, bytes):
            return v
        raise BadRequestError(f"op {i}: {name!r} must be a string or bytes")
    if b64 is not None:
        if not isinstance(b64, str):
            raise BadRequestError(f"op {i}: {name + '_b64'!r} must be a base64 string")
        try:
            return base64.b64decode(b64, validate=True)
        except (binascii.Error, ValueError) as err:
            raise BadRequestError(f"op {i}: {name + '_b64'!r} is not valid base64") from err
    if required:
        raise BadRequestError(f"op {i}: {name!r} (or {name + '_b64'!r}) is required")
    return None


def batch_ops(doc: Any, owner: str, *, max_ops: int, max_key: int, max_value: int) -> list[Op]:
    """Ops of a ``{"ops": [...]}`` document, validated; owner set to the producer."""
    if not isinstance(doc, dict) or not isinstance(doc.get("ops"), list):
        raise BadRequestError('body must be an object with an "ops" array')
    raw_ops = doc["ops"]
    if not raw_ops:
        raise BadRequestError('"ops" is empty')
    if len(raw_ops) > max_ops:
        raise TooLargeError(f"batch has {len(raw_ops)} ops; at most {max_ops} per request")
    out: list[Op] = []
    append = out.append
    for i, op in enumerate(raw_ops):
        # Fast path for the common shape {"op": "set", "key": str, "value": str}: no
        # helper calls per pair (this loop is a third of the gateway's per-pair cost).
        if type(op) is dict and len(op) == 3:
            key = op.get("key")
            value = op.get("value")
            if type(key) is str and type(value) is str and op.get("op") == "set":
                kb = key.encode("utf-8", "surrogatepass")
                vb = value.encode("utf-8", "surrogatepass")
                if 0 < len(kb) <= max_key and len(vb) <= max_value:
                    # tuple.__new__ skips the NamedTuple's Python-level __new__
                    append(_new(Op, (SET, kb, vb, owner, None, 0)))
                    continue
        append(_slow_op(op, i, owner, max_key, max_value))
    return out


#: The members an op may have (anything else is refused, never ignored).
_OP_FIELDS = frozenset(
    ("op", "key", "key_b64", "value", "value_b64", "if_seq", "if_absent", "ttl", "expires_at")
)


def _slow_op(op: Any, i: int, owner: str, max_key: int, max_value: int) -> Op:
    """One op of any accepted shape, or the exact reason it is refused."""
    if not isinstance(op, dict):
        raise BadRequestError(f"op {i} must be an object")
    unknown = [k for k in op if k not in _OP_FIELDS]
    if unknown:
        # A misspelt condition ("if_sq") must not turn into an unconditional write.
        raise BadRequestError(
            f"op {i}: unknown field {unknown[0]!r}; an op has {', '.join(sorted(_OP_FIELDS))}"
        )
    kind = op.get("op")
    key = _bytes_field(op, "key", i, True)
    assert key is not None
    check_key(key, max_key, f"op {i}: key")
    if kind == "set":
        value = _bytes_field(op, "value", i, True)
        assert value is not None
        if len(value) > max_value:
            raise TooLargeError(
                f"op {i}: value is {len(value)} bytes; values are at most {max_value} bytes"
            )
        try:
            deadline = ttl.deadline_of(op.get("ttl"), op.get("expires_at"), ttl.now_us())
        except BadRequestError as err:
            raise BadRequestError(f"op {i}: {err.message}", hint=err.hint) from err
        return Op(SET, key, value, owner, _condition(op, i), deadline)
    if kind == "delete":
        if "value" in op or "value_b64" in op:  # a set misspelt as a delete: never guess
            raise BadRequestError(f"op {i}: a delete carries no value")
        if "ttl" in op or "expires_at" in op:
            raise BadRequestError(f"op {i}: a delete takes no ttl or expires_at")
        return Op(DELETE, key, b"", owner, _condition(op, i))
    raise BadRequestError(f'op {i}: "op" must be "set" or "delete", got {kind!r}')


#: Largest `if_seq` (seqs are u64 in the store; JSON clients lose precision beyond 2**53).
MAX_IF_SEQ = (1 << 63) - 1


def _condition(op: dict[str, Any], i: int) -> int | None:
    """expect_seq of op `i` from its ``if_seq`` (the key's current version must be N, 0
    meaning absent) or ``if_absent: true`` (same as ``if_seq: 0``); None when neither."""
    for name in ("if_seq", "if_absent"):
        if name in op and op[name] is None:  # null is no condition: never run unconditional
            raise BadRequestError(f'op {i}: "{name}" is null; leave it out for no condition')
    if_seq = op.get("if_seq")
    if_absent = op.get("if_absent")
    if if_absent is not None and if_absent is not True and if_absent is not False:
        raise BadRequestError(f'op {i}: "if_absent" must be true or false')
    if if_seq is not None:
        if type(if_seq) is not int or not 0 <= if_seq <= MAX_IF_SEQ:
            raise BadRequestError(f'op {i}: "if_seq" must be an integer from 0 to {MAX_IF_SEQ}')
        if if_absent is True and if_seq != 0:
            raise BadRequestError(f'op {i}: "if_absent": true contradicts "if_seq": {if_seq}')
        return int(if_seq)
    return 0 if if_absent is True else None
