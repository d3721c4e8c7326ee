// Does a cache hint change a 16-byte-vector copy's bandwidth on Hopper?
// nvcc -O3 -gencode=arch=compute_90a,code=sm_90a copy_hints.cu -o copy_hints && ./copy_hints
#include <cstdio>
#include <cuda_runtime.h>

template <int MODE>
__global__ void copy_kernel(const uint4* __restrict__ x, uint4* __restrict__ y, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x * 2 + threadIdx.x;
  uint4 a, b;
  const uint4* p0 = x + i; const uint4* p1 = x + i + blockDim.x;
  if (MODE == 0) { a = *p0; b = *p1; }
  else {
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(a.x), "=r"(a.y), "=r"(a.z), "=r"(a.w) : "l"(p0));
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(b.x), "=r"(b.y), "=r"(b.z), "=r"(b.w) : "l"(p1));
  }
  if (MODE == 2) {
    asm volatile("st.global.cs.v4.u32 [%0], {%1,%2,%3,%4};" :: "l"(y + i), "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w));
    asm volatile("st.global.cs.v4.u32 [%0], {%1,%2,%3,%4};" :: "l"(y + i + blockDim.x), "r"(b.x), "r"(b.y), "r"(b.z), "r"(b.w));
  } else { y[i] = a; y[i + blockDim.x] = b; }
}

template <int MODE> float time_it(const uint4* x, uint4* y, long long n) {
  int threads = 256; long long blocks = n / (threads * 2);
  cudaEvent_t s, e; cudaEventCreate(&s); cudaEventCreate(&e);
  for (int w = 0; w < 5; ++w) copy_kernel<MODE><<<blocks, threads>>>(x, y, n);
  cudaEventRecord(s);
  for (int r = 0; r < 50; ++r) copy_kernel<MODE><<<blocks, threads>>>(x, y, n);
  cudaEventRecord(e); cudaEventSynchronize(e);
  float ms; cudaEventElapsedTime(&ms, s, e); return ms / 50;
}

int main() {
  long long n = 1LL << 26;  // 16-byte vectors: 1 GiB per tensor
  uint4 *x, *y; cudaMalloc(&x, n * 16); cudaMalloc(&y, n * 16);
  cudaMemset(x, 1, n * 16);
  float ms0 = time_it<0>(x, y, n), ms1 = time_it<1>(x, y, n), ms2 = time_it<2>(x, y, n);
  cudaEvent_t s, e; cudaEventCreate(&s); cudaEventCreate(&e);
  cudaEventRecord(s); for (int r = 0; r < 50; ++r) cudaMemcpyAsync(y, x, n * 16, cudaMemcpyDeviceToDevice);
  cudaEventRecord(e); cudaEventSynchronize(e); float msm; cudaEventElapsedTime(&msm, s, e); msm /= 50;
  double bytes = 2.0 * n * 16;
  printf("plain loads/stores        %.2f TB/s\n", bytes / ms0 / 1e9);
  printf("ld .nc.L1::no_allocate.L2::256B  %.2f TB/s\n", bytes / ms1 / 1e9);
  printf("+ st.global.cs            %.2f TB/s\n", bytes / ms2 / 1e9);
  printf("cudaMemcpyAsync D2D       %.2f TB/s\n", bytes / msm / 1e9);
  printf("error: %s\n", cudaGetErrorString(cudaGetLastError()));
}
