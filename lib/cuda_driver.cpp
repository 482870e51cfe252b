#include "cuda_driver.hpp"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <mutex>
#include <optional>

#include <rdmx/error.hpp>

namespace rdmx::detail
{
namespace
{

// The ABI the signatures above are written for: cuGetProcAddress hands out the entry point
// of each name as CUDA 12.0 defined it (cuMemAlloc is cuMemAlloc_v2, and so on).
constexpr int abi_version = 12000;

using get_proc_address_fn = cu_result (*)(const char* symbol, void** pfn, int version, std::uint64_t flags,
                                          int* status);

struct entry {
    const char* name;   ///< for cuGetProcAddress
    const char* symbol; ///< for dlsym, where the driver predates cuGetProcAddress_v2
    bool required;
};

template <class Fn>
bool resolve(void* lib, get_proc_address_fn gpa, const entry& e, Fn*& out, std::string& why)
{
    void* p = nullptr;
    int status = 0;
    if (gpa == nullptr || gpa(e.name, &p, abi_version, 0, &status) != cu_success || status != 0)
        p = dlsym(lib, e.symbol);
    out = reinterpret_cast<Fn*>(p);
    if (p == nullptr && e.required) {
        why = std::string("the CUDA driver lacks ") + e.symbol;
        return false;
    }
    return true;
}

std::string open_failure(const char* path)
{
    const char* err = dlerror();
    return std::string(err ? err : path) + " (no NVIDIA driver: device memory needs libcuda.so.1)";
}

} // namespace

std::string cuda_driver::describe(const char* call, cu_result rc) const
{
    const char* name = nullptr;
    const char* text = nullptr;
    // The toolkit's stub libcuda answers these with CUDA_ERROR_STUB_LIBRARY too: the codes
    // a failing load meets most are named here as well.
    if (get_error_name(rc, &name) != cu_success || name == nullptr ||
        get_error_string(rc, &text) != cu_success || text == nullptr) {
        switch (rc) {
        case 2: name = "CUDA_ERROR_OUT_OF_MEMORY", text = "out of memory"; break;
        case 3: name = "CUDA_ERROR_NOT_INITIALIZED", text = "initialization error"; break;
        case 34:
            name = "CUDA_ERROR_STUB_LIBRARY";
            text = "the toolkit's stub libcuda.so, not a driver, was loaded";
            break;
        case 35:
            name = "CUDA_ERROR_INSUFFICIENT_DRIVER", text = "the driver is older than the runtime";
            break;
        case 100: name = "CUDA_ERROR_NO_DEVICE", text = "no CUDA-capable device is detected"; break;
        default: name = "CUDA error", text = "unknown"; break;
        }
    }
    return std::string(call) + ": " + name + " (" + text + ", " + std::to_string(rc) + ")";
}

cu_context cuda_driver::use_device(int device) const
{
    // Primary contexts are what the runtime API uses too: memory a cudaMalloc made is
    // reachable from it. Retained once per device and kept: releasing the last reference
    // would destroy allocations the application still uses.
    static std::mutex mu;
    static cu_context contexts[64] = {};
    if (device < 0 || device >= 64)
        throw_error(errc::invalid_argument, "CUDA device " + std::to_string(device) + " out of range");
    cu_context ctx;
    {
        std::lock_guard lk(mu);
        if (contexts[device] == nullptr) {
            cu_device dev;
            if (cu_result rc = device_get(&dev, device); rc != cu_success)
                throw_error(errc::invalid_argument, describe("cuDeviceGet", rc));
            if (cu_result rc = device_primary_ctx_retain(&contexts[device], dev); rc != cu_success)
                throw_error(errc::invalid_argument, describe("cuDevicePrimaryCtxRetain", rc));
        }
        ctx = contexts[device];
    }
    cu_context previous = nullptr;
    if (cu_result rc = ctx_get_current(&previous); rc != cu_success)
        throw_error(errc::invalid_argument, describe("cuCtxGetCurrent", rc));
    if (cu_result rc = ctx_set_current(ctx); rc != cu_success)
        throw_error(errc::invalid_argument, describe("cuCtxSetCurrent", rc));
    return previous;
}

bool cuda_in_process() noexcept
{
    void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (h == nullptr)
        return false;
    dlclose(h); // drops the reference RTLD_NOLOAD took, not the library
    return true;
}

std::unique_ptr<cuda_driver> load_cuda_driver(const char* path, std::string& why)
{
    // Never dlclose'd: the driver keeps threads and state that outlive any handle of ours.
    void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
        why = open_failure(path);
        return nullptr;
    }
    auto gpa = reinterpret_cast<get_proc_address_fn>(dlsym(lib, "cuGetProcAddress_v2"));
    auto d = std::make_unique<cuda_driver>();
    bool ok =
        resolve(lib, gpa, {"cuInit", "cuInit", true}, d->init, why) &&
        resolve(lib, gpa, {"cuDriverGetVersion", "cuDriverGetVersion", true}, d->driver_get_version, why) &&
        resolve(lib, gpa, {"cuGetErrorName", "cuGetErrorName", true}, d->get_error_name, why) &&
        resolve(lib, gpa, {"cuGetErrorString", "cuGetErrorString", true}, d->get_error_string, why) &&
        resolve(lib, gpa, {"cuDeviceGetCount", "cuDeviceGetCount", true}, d->device_get_count, why) &&
        resolve(lib, gpa, {"cuDeviceGet", "cuDeviceGet", true}, d->device_get, why) &&
        resolve(lib, gpa, {"cuDeviceGetAttribute", "cuDeviceGetAttribute", true}, d->device_get_attribute,
                why) &&
        resolve(lib, gpa, {"cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRetain", true},
                d->device_primary_ctx_retain, why) &&
        resolve(lib, gpa, {"cuCtxGetCurrent", "cuCtxGetCurrent", true}, d->ctx_get_current, why) &&
        resolve(lib, gpa, {"cuCtxSetCurrent", "cuCtxSetCurrent", true}, d->ctx_set_current, why) &&
        resolve(lib, gpa, {"cuPointerGetAttribute", "cuPointerGetAttribute", true}, d->pointer_get_attribute,
                why) &&
        resolve(lib, gpa, {"cuMemGetAddressRange", "cuMemGetAddressRange_v2", true}, d->mem_get_address_range,
                why) &&
        resolve(lib, gpa, {"cuMemAlloc", "cuMemAlloc_v2", true}, d->mem_alloc, why) &&
        resolve(lib, gpa, {"cuMemFree", "cuMemFree_v2", true}, d->mem_free, why) &&
        resolve(lib, gpa, {"cuMemAllocManaged", "cuMemAllocManaged", true}, d->mem_alloc_managed, why) &&
        resolve(lib, gpa, {"cuMemcpyHtoD", "cuMemcpyHtoD_v2", true}, d->memcpy_htod, why) &&
        resolve(lib, gpa, {"cuMemcpyDtoH", "cuMemcpyDtoH_v2", true}, d->memcpy_dtoh, why) &&
        resolve(lib, gpa, {"cuMemHostAlloc", "cuMemHostAlloc", false}, d->mem_host_alloc, why) &&
        resolve(lib, gpa, {"cuMemFreeHost", "cuMemFreeHost", false}, d->mem_free_host, why) &&
        resolve(lib, gpa, {"cuStreamCreate", "cuStreamCreate", false}, d->stream_create, why) &&
        resolve(lib, gpa, {"cuStreamDestroy", "cuStreamDestroy_v2", false}, d->stream_destroy, why) &&
        resolve(lib, gpa, {"cuStreamSynchronize", "cuStreamSynchronize", false}, d->stream_synchronize,
                why) &&
        resolve(lib, gpa, {"cuMemcpyHtoDAsync", "cuMemcpyHtoDAsync_v2", false}, d->memcpy_htod_async, why) &&
        resolve(lib, gpa, {"cuMemcpyDtoHAsync", "cuMemcpyDtoHAsync_v2", false}, d->memcpy_dtoh_async, why) &&
        resolve(lib, gpa, {"cuMemGetAllocationGranularity", "cuMemGetAllocationGranularity", true},
                d->mem_get_allocation_granularity, why) &&
        resolve(lib, gpa, {"cuMemCreate", "cuMemCreate", true}, d->mem_create, why) &&
        resolve(lib, gpa, {"cuMemRelease", "cuMemRelease", true}, d->mem_release, why) &&
        resolve(lib, gpa, {"cuMemAddressReserve", "cuMemAddressReserve", true}, d->mem_address_reserve,
                why) &&
        resolve(lib, gpa, {"cuMemAddressFree", "cuMemAddressFree", true}, d->mem_address_free, why) &&
        resolve(lib, gpa, {"cuMemMap", "cuMemMap", true}, d->mem_map, why) &&
        resolve(lib, gpa, {"cuMemUnmap", "cuMemUnmap", true}, d->mem_unmap, why) &&
        resolve(lib, gpa, {"cuMemSetAccess", "cuMemSetAccess", true}, d->mem_set_access, why) &&
        resolve(lib, gpa, {"cuMemGetHandleForAddressRange", "cuMemGetHandleForAddressRange", false},
                d->mem_get_handle_for_address_range, why);
    if (!ok)
        return nullptr;
    if (cu_result rc = d->init(0); rc != cu_success) {
        // The toolkit's stub libcuda.so says CUDA_ERROR_STUB_LIBRARY here.
        why = d->describe("cuInit", rc);
        return nullptr;
    }
    if (cu_result rc = d->driver_get_version(&d->version); rc != cu_success) {
        why = d->describe("cuDriverGetVersion", rc);
        return nullptr;
    }
    return d;
}

bool copy_device(bool to_host, int device, void* dst, const void* src, std::size_t n,
                 std::string& why) noexcept
{
    const cuda_driver* d = cuda(&why);
    if (!d)
        return false;
    try {
        device_scope scope(*d, device);
        const cu_result rc = to_host ? d->memcpy_dtoh(dst, reinterpret_cast<cu_deviceptr>(src), n)
                                     : d->memcpy_htod(reinterpret_cast<cu_deviceptr>(dst), src, n);
        if (rc == cu_success)
            return true;
        why = d->describe(to_host ? "cuMemcpyDtoH" : "cuMemcpyHtoD", rc);
    } catch (const std::exception& e) {
        why = e.what();
    }
    return false;
}

const cuda_driver* cuda(std::string* why) noexcept
{
    static std::once_flag once;
    static std::unique_ptr<cuda_driver> driver;
    static std::string failure;
    std::call_once(once, [] {
        const char* path = std::getenv("RDMX_CUDA_DRIVER");
        try {
            driver = load_cuda_driver(path && *path ? path : "libcuda.so.1", failure);
        } catch (const std::bad_alloc&) {
            failure = "out of memory loading the CUDA driver";
        }
    });
    if (driver == nullptr && why != nullptr)
        *why = failure;
    return driver.get();
}

memory_placement place_memory(const void* addr, std::size_t length, memory_type requested, const char* verb)
{
    memory_placement p;
    if (requested == memory_type::host)
        return p;
    if (requested == memory_type::detect && !cuda_in_process())
        return p; // no CUDA call was ever made here: no pointer can be device memory
    std::string why;
    const cuda_driver* d = cuda(&why);
    if (d == nullptr) {
        if (requested == memory_type::detect)
            return p;
        throw_error(errc::not_supported,
                    std::string(verb) + ": CUDA device memory needs the CUDA driver: " + why);
    }
    auto ptr = reinterpret_cast<cu_deviceptr>(addr);
    unsigned type = 0;
    cu_result rc = d->pointer_get_attribute(&type, cu_pointer_attribute_memory_type, ptr);
    if (rc != cu_success || type != cu_memorytype_device) {
        // cuPointerGetAttribute says CUDA_ERROR_INVALID_VALUE for memory CUDA never saw.
        if (requested == memory_type::detect)
            return p;
        throw_error(errc::invalid_argument,
                    std::string(verb) + ": memory_type::cuda given, but the CUDA driver does not know " +
                        std::to_string(ptr) + " as device memory" +
                        (rc != cu_success ? " (" + d->describe("cuPointerGetAttribute", rc) + ")" : ""));
    }
    int managed = 0;
    if (d->pointer_get_attribute(&managed, cu_pointer_attribute_is_managed, ptr) == cu_success && managed)
        throw_error(errc::not_supported,
                    std::string(verb) + ": CUDA managed memory (cudaMallocManaged) can migrate between host "
                                        "and device under the NIC; register device or host memory");
    int ordinal = -1;
    if (cu_result r = d->pointer_get_attribute(&ordinal, cu_pointer_attribute_device_ordinal, ptr);
        r != cu_success)
        throw_error(errc::invalid_argument,
                    std::string(verb) + ": " + d->describe("cuPointerGetAttribute", r));
    p.type = memory_type::cuda;
    p.device = ordinal;
    // Walk the allocations under the range: one for cudaMalloc memory; several, mapped back
    // to back in one reservation, for CUDA virtual memory. A gap or the end of device
    // memory inside the range is the caller's error, not something to register.
    device_scope scope(*d, ordinal);
    cu_deviceptr at = ptr, end = ptr + length;
    while (at < end) {
        cu_deviceptr base = 0;
        std::size_t size = 0;
        rc = d->mem_get_address_range(&base, &size, at);
        if (rc != cu_success || size == 0)
            throw_error(errc::invalid_argument,
                        std::string(verb) + ": [" + std::to_string(ptr) + ", +" + std::to_string(length) +
                            ") runs past the CUDA device memory mapped there (" +
                            (rc != cu_success ? d->describe("cuMemGetAddressRange", rc)
                                              : std::string("an empty allocation")) +
                            " at " + std::to_string(at) + ")");
        ++p.allocations;
        at = base + size;
    }
    return p;
}

dmabuf_export export_dmabuf(const void* addr, std::size_t length, int device, std::string& why) noexcept
{
    dmabuf_export out;
    const cuda_driver* d = cuda(&why);
    if (d == nullptr)
        return out;
    if (d->mem_get_handle_for_address_range == nullptr) {
        why = "the CUDA driver (version " + std::to_string(d->version) +
              ") has no cuMemGetHandleForAddressRange (dma-buf needs 11.7 or later)";
        return out;
    }
    std::optional<device_scope> scope;
    try {
        scope.emplace(*d, device);
        cu_device dev;
        int supported = 0;
        if (cu_result rc = d->device_get(&dev, device); rc != cu_success) {
            why = d->describe("cuDeviceGet", rc);
            return out;
        }
        if (d->device_get_attribute(&supported, cu_device_attribute_dma_buf_supported, dev) != cu_success ||
            !supported) {
            why = "CUDA device " + std::to_string(device) +
                  " does not support dma-buf "
                  "(CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED is 0: the kernel or the driver is too old, or the "
                  "open kernel modules are not in use)";
            return out;
        }
    } catch (const std::exception& e) {
        why = e.what();
        return out;
    }
    // The exported range must start and end on host pages (as libfabric and UCX align it).
    auto page = static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
    auto a = reinterpret_cast<std::uint64_t>(addr);
    std::uint64_t base = a & ~(page - 1);
    std::uint64_t end = (a + length + page - 1) & ~(page - 1);
    int fd = -1;
    if (cu_result rc = d->mem_get_handle_for_address_range(&fd, base, end - base,
                                                           cu_mem_range_handle_type_dma_buf_fd, 0);
        rc != cu_success) {
        why = d->describe("cuMemGetHandleForAddressRange", rc);
        return out;
    }
    out.fd = fd;
    out.offset = a - base;
    return out;
}

} // namespace rdmx::detail
