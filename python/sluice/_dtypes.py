"""The torch dtypes Sluice stores, and their names in the C++ core (the
safetensors spelling of ``DType``). Shared by the package's modules."""

import torch

DTYPE_NAMES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}
DTYPES_BY_NAME = {v: k for k, v in DTYPE_NAMES.items()}


def dtype_list() -> str:
    """"float64, float32, ...": the supported dtypes, for messages."""
    return ", ".join(str(d).replace("torch.", "") for d in DTYPE_NAMES)
