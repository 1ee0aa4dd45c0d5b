/* cuda_info: the CUDA devices as the CUDA runtime reports them, for
 * scripts/gpu-check.sh's environment record (its env step builds this with
 * `nvcc -o cuda_info scripts/cuda_info.c`: host code only, cudart linked
 * statically, a second or two).
 *
 * One line for the versions, then one per device:
 *   cuda: driver 13.0, runtime 13.0, 1 device(s)
 *   cuda device 0: NVIDIA H100 80GB HBM3, sm_90, 132 SMs, 79.1 GiB total, 78.6 GiB free, pci 0000:19:00.0
 * Exit 0 with at least one device; 1, with the runtime's error, without. */
#include <stdio.h>

#include <cuda_runtime_api.h> /* defines: cudaGetDeviceCount, cudaGetDeviceProperties, cudaMemGetInfo */

int main(void)
{
    int drv = 0, rt = 0, n = 0;
    cudaDriverGetVersion(&drv);   /* 0 where no driver is installed */
    cudaRuntimeGetVersion(&rt);
    cudaError_t e = cudaGetDeviceCount(&n);
    printf("cuda: driver %d.%d, runtime %d.%d, %d device(s)\n", drv / 1000, drv % 1000 / 10, rt / 1000,
           rt % 1000 / 10, e == cudaSuccess ? n : 0);
    if (e != cudaSuccess || n == 0) {
        printf("cuda: no device: %s\n", e != cudaSuccess ? cudaGetErrorString(e) : "none listed");
        return 1;
    }
    for (int i = 0; i < n; i++) {
        struct cudaDeviceProp p;
        size_t free_b = 0, total_b = 0;
        if ((e = cudaGetDeviceProperties(&p, i)) != cudaSuccess || (e = cudaSetDevice(i)) != cudaSuccess ||
            (e = cudaMemGetInfo(&free_b, &total_b)) != cudaSuccess) {
            printf("cuda device %d: %s\n", i, cudaGetErrorString(e));
            return 1;
        }
        printf("cuda device %d: %s, sm_%d%d, %d SMs, %.1f GiB total, %.1f GiB free, pci %04x:%02x:%02x.0\n",
               i, p.name, p.major, p.minor, p.multiProcessorCount, (double)total_b / (1 << 30),
               (double)free_b / (1 << 30), p.pciDomainID, p.pciBusID, p.pciDeviceID);
    }
    return 0;
}
