// A user of <rdmx/gpu.hpp>: links against librdmx alone (no CUDA library), and on a machine
// without a GPU runs and says why there is no device memory.
#include <iostream>

#include <rdmx/gpu.hpp>

int main()
{
    int n = rdmx::gpu::device_count();
    std::cout << "rdmx: " << n << " CUDA devices";
    if (n == 0)
        std::cout << " (" << rdmx::gpu::unavailable_reason() << ")";
    std::cout << "\n";
}
