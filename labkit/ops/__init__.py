"""The kit's own GPU kernels: the layers no stage asks students to write (kernels), the fc as register-tiled and CUDA C
GEMMs (gemm, gemm_cuda), Winograd and tensor-core convs (winograd, tensor_cores, conv_banks), and kernels built
around one weight array (const_kernels)."""
