from store.ops import Op, Result

def count_one(
    ops: list[Op], results: list[Result], written: object, deleted: object, duplicate: object
) -> tuple[int, int, int, int]: ...
