from store.ops import Op

NOGIL_MIN: int

def decode_json_ops(
    body: bytes, owner: str, max_ops: int, max_key: int, max_value: int
) -> tuple[list[Op], int] | None: ...
