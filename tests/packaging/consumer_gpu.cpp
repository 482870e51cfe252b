// A user of the installed GPU library (pkg-config rdmx-gpu): links and runs without a GPU.
#include <iostream>

#include <rdmx/gpu.hpp>

int main()
{
    std::cout << "rdmx-gpu: " << rdmx::gpu::device_count() << " CUDA devices\n";
}
