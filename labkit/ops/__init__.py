"""The kit's own GPU kernels: the layers no stage asks students to write (kernels), the fc as register-tiled and CUDA C
GEMMs (gemm, gemm_cuda), Winograd and tensor-core convs (winograd, tensor_cores with its CUDA C tensor_cores_source,
conv_banks), and kernels built around one weight array (const_kernels)."""
