"""Does MLX-CUDA's gather_qmm read past x for sorted rows of one token each? (c7)"""
import mlx.core as mx
E, N, D = 32, 256, 128
w = mx.random.normal((E, N, D)).astype(mx.bfloat16)
wq, s, b = mx.quantize(w, group_size=32, bits=4)
for rows in (12, 48, 64, 192):
    for srt in (True, False):
        x = mx.random.normal((rows, 1, D)).astype(mx.bfloat16)
        idx = mx.sort(mx.random.randint(0, E, (rows,))).astype(mx.uint32)
        y = mx.gather_qmm(x, wq, s, b, rhs_indices=idx, transpose=True, group_size=32, bits=4, sorted_indices=srt)
        mx.eval(y)
        print("rows", rows, "sorted", srt, y.shape, flush=True)
