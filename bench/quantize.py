"""llama.cpp's quantiser (`llama_model_quantize`) through llama-cpp-python, from the peer's
virtualenv (testdata/README.md): quantize.py IN.gguf OUT.gguf FTYPE (2 = Q4_0, 15 = Q4_K_M,
llama.h's `enum llama_ftype`)."""
import sys, ctypes, llama_cpp
src, dst, ftype = sys.argv[1], sys.argv[2], int(sys.argv[3])
p = llama_cpp.llama_model_quantize_default_params()
p.ftype = ftype; p.nthread = 2
rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(p))
print("rc", rc)
