"""The element types a pw program's values may have: one table for every layer.

Each entry names a type as MLIR and JAX's StableHLO spell it (`f32`, `i4`,
`f8E4M3FNUZ`), as NumPy names its dtype (JAX's narrow floats and integers
are ml_dtypes' dtypes: `float8_e4m3fnuz`, `int4`), and the bytes one element
takes as the runtime counts device memory (a narrow type, `i1` included,
one byte: XLA:CPU stores one element in each). The list is the dtypes
`jax.export`, which carries a placed function's code, can serialise: JAX's
`int2` and `uint2` it cannot, so a value of them has no pw type.
"""

# (MLIR element type, NumPy dtype name, bytes per element)
_TABLE = (
    ("i1", "bool", 1),
    ("i4", "int4", 1), ("i8", "int8", 1), ("i16", "int16", 2), ("i32", "int32", 4), ("i64", "int64", 8),
    ("ui4", "uint4", 1), ("ui8", "uint8", 1), ("ui16", "uint16", 2), ("ui32", "uint32", 4), ("ui64", "uint64", 8),
    ("f4E2M1FN", "float4_e2m1fn", 1),
    ("f8E3M4", "float8_e3m4", 1), ("f8E4M3", "float8_e4m3", 1), ("f8E4M3FN", "float8_e4m3fn", 1),
    ("f8E4M3FNUZ", "float8_e4m3fnuz", 1), ("f8E4M3B11FNUZ", "float8_e4m3b11fnuz", 1), ("f8E5M2", "float8_e5m2", 1),
    ("f8E5M2FNUZ", "float8_e5m2fnuz", 1), ("f8E8M0FNU", "float8_e8m0fnu", 1),
    ("bf16", "bfloat16", 2), ("f16", "float16", 2), ("f32", "float32", 4), ("f64", "float64", 8),
    ("complex<f32>", "complex64", 8), ("complex<f64>", "complex128", 16),
)

ELEMENT_BYTES = {element: size for element, _, size in _TABLE}
"""MLIR element type -> bytes per element."""
NUMPY_NAMES = {element: name for element, name, _ in _TABLE}
"""MLIR element type -> NumPy dtype name."""
ELEMENT_TYPES = {name: element for element, name, _ in _TABLE}
"""NumPy dtype name -> MLIR element type."""
SUB_BYTE_TYPES = frozenset({"i4", "ui4", "f4E2M1FN"})
"""The 4-bit types: XLA:CPU packs two elements in a byte in the arrays its computations make, but not in those
`jax.device_put` makes (`runtime/executables.py` says what follows)."""
