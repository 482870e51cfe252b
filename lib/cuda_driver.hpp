// CUDA at run time only: the driver API (libcuda.so.1) loaded with dlopen the first time
// device memory is asked for, its entry points resolved with cuGetProcAddress. librdmx
// links no CUDA library and includes no CUDA header: the few types and constants used here
// are declared below, as the driver's ABI fixes them (tests/gpu/cuda_abi_test.cpp checks
// each against the toolkit's cuda.h where one is installed).
//
// A process that has device memory has the driver loaded already (its own CUDA calls did
// that), so deciding whether a pointer is device memory costs nothing in one that does not:
// cuda_in_process() asks the dynamic loader without loading anything.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include <rdmx/memory.hpp>

namespace rdmx::detail
{

// ---- the driver's ABI, as far as rdmx uses it ---------------------------------------------
using cu_result = int;
using cu_device = int;
using cu_deviceptr = unsigned long long;
using cu_context = struct cu_context_st*;
using cu_mem_handle = unsigned long long;
using cu_stream = struct cu_stream_st*;

inline constexpr cu_result cu_success = 0;
inline constexpr cu_result cu_error_invalid_value = 1;

inline constexpr int cu_pointer_attribute_memory_type = 2;
inline constexpr int cu_pointer_attribute_is_managed = 8;
inline constexpr int cu_pointer_attribute_device_ordinal = 9;
inline constexpr unsigned cu_memorytype_device = 2;

inline constexpr int cu_device_attribute_virtual_memory_management_supported = 102;
inline constexpr int cu_device_attribute_gpu_direct_rdma_with_cuda_vmm_supported = 110;
inline constexpr int cu_device_attribute_dma_buf_supported = 124;
inline constexpr int cu_mem_range_handle_type_dma_buf_fd = 1;

inline constexpr int cu_mem_allocation_type_pinned = 1;
inline constexpr int cu_mem_location_type_device = 1;
inline constexpr int cu_mem_access_flags_prot_readwrite = 3;
inline constexpr int cu_mem_alloc_granularity_minimum = 0;
inline constexpr unsigned cu_mem_attach_global = 1;
inline constexpr unsigned cu_memhostalloc_portable = 1;
inline constexpr unsigned cu_stream_non_blocking = 1;

struct cu_mem_location {
    int type;
    int id;
};
struct cu_mem_allocation_prop {
    int type;
    int requested_handle_types;
    cu_mem_location location;
    void* win32_handle_meta_data;
    struct {
        unsigned char compression_type;
        unsigned char gpu_direct_rdma_capable;
        unsigned short usage;
        unsigned char reserved[4];
    } alloc_flags;
};
struct cu_mem_access_desc {
    cu_mem_location location;
    int flags;
};

/// The driver's entry points (the CUDA 12.0 ABI of each), resolved once.
struct cuda_driver {
    cu_result (*init)(unsigned flags);
    cu_result (*driver_get_version)(int* version);
    cu_result (*get_error_name)(cu_result, const char** name);
    cu_result (*get_error_string)(cu_result, const char** text);
    cu_result (*device_get_count)(int* count);
    cu_result (*device_get)(cu_device* dev, int ordinal);
    cu_result (*device_get_attribute)(int* value, int attribute, cu_device dev);
    cu_result (*device_primary_ctx_retain)(cu_context* ctx, cu_device dev);
    cu_result (*ctx_get_current)(cu_context* ctx);
    cu_result (*ctx_set_current)(cu_context ctx);
    cu_result (*pointer_get_attribute)(void* data, int attribute, cu_deviceptr ptr);
    cu_result (*mem_get_address_range)(cu_deviceptr* base, std::size_t* size, cu_deviceptr ptr);
    cu_result (*mem_alloc)(cu_deviceptr* ptr, std::size_t size);
    cu_result (*mem_free)(cu_deviceptr ptr);
    cu_result (*mem_alloc_managed)(cu_deviceptr* ptr, std::size_t size, unsigned flags);
    cu_result (*memcpy_htod)(cu_deviceptr dst, const void* src, std::size_t size);
    cu_result (*memcpy_dtoh)(void* dst, cu_deviceptr src, std::size_t size);
    /// Page-locked host memory (the TCP backend's staging chunks); null if the driver lacks it.
    cu_result (*mem_host_alloc)(void** ptr, std::size_t size, unsigned flags);
    cu_result (*mem_free_host)(void* ptr);
    /// Asynchronous copies on a stream of rdmx's own (the TCP backend's staging); null if
    /// the driver lacks any of them (then the copies are synchronous).
    cu_result (*stream_create)(cu_stream* stream, unsigned flags);
    cu_result (*stream_destroy)(cu_stream stream);
    cu_result (*stream_synchronize)(cu_stream stream);
    cu_result (*memcpy_htod_async)(cu_deviceptr dst, const void* src, std::size_t size, cu_stream stream);
    cu_result (*memcpy_dtoh_async)(void* dst, cu_deviceptr src, std::size_t size, cu_stream stream);
    // CUDA virtual memory (cuMemCreate + cuMemMap: PyTorch's expandable segments).
    cu_result (*mem_get_allocation_granularity)(std::size_t* granularity, const cu_mem_allocation_prop* prop,
                                                int option);
    cu_result (*mem_create)(cu_mem_handle* handle, std::size_t size, const cu_mem_allocation_prop* prop,
                            unsigned long long flags);
    cu_result (*mem_release)(cu_mem_handle handle);
    cu_result (*mem_address_reserve)(cu_deviceptr* ptr, std::size_t size, std::size_t alignment,
                                     cu_deviceptr addr, unsigned long long flags);
    cu_result (*mem_address_free)(cu_deviceptr ptr, std::size_t size);
    cu_result (*mem_map)(cu_deviceptr ptr, std::size_t size, std::size_t offset, cu_mem_handle handle,
                         unsigned long long flags);
    cu_result (*mem_unmap)(cu_deviceptr ptr, std::size_t size);
    cu_result (*mem_set_access)(cu_deviceptr ptr, std::size_t size, const cu_mem_access_desc* desc,
                                std::size_t count);
    /// dma-buf export (CUDA 11.7 and later drivers); null where the driver lacks it.
    cu_result (*mem_get_handle_for_address_range)(void* handle, cu_deviceptr ptr, std::size_t size,
                                                  int handle_type, unsigned long long flags);

    int version = 0; ///< cuDriverGetVersion: 12040 for 12.4

    /// "cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY (out of memory)".
    std::string describe(const char* call, cu_result rc) const;
    /// Makes `device`'s primary context current on this thread (retained once, for the
    /// process's lifetime) and returns the one that was. Throws rdmx::error naming the call.
    cu_context use_device(int device) const;
};

/// `device`'s primary context current on this thread for the scope, and the application's
/// own current context (if any) back afterwards: rdmx's calls leave the thread as it was.
class device_scope
{
public:
    device_scope(const cuda_driver& d, int device) : d_(d), previous_(d.use_device(device)) {}
    ~device_scope() { d_.ctx_set_current(previous_); }
    device_scope(const device_scope&) = delete;
    device_scope& operator=(const device_scope&) = delete;

private:
    const cuda_driver& d_;
    cu_context previous_;
};

/// Copies `n` bytes from device memory of `device` at `src` to host memory at `dst`
/// (`to_host`), or from host memory at `src` to device memory at `dst`, synchronously in
/// the device's primary context (the thread's own context left as it was). false, and
/// `why` naming the call and its error ("cuMemcpyDtoH: CUDA_ERROR_..."), if it failed.
bool copy_device(bool to_host, int device, void* dst, const void* src, std::size_t n,
                 std::string& why) noexcept;

/// Whether libcuda.so.1 is loaded in this process (asked without loading it).
bool cuda_in_process() noexcept;

/// The process's driver, loaded on the first call (RDMX_CUDA_DRIVER names another file
/// than libcuda.so.1). Null where it cannot be had; then `why` (if given) says what is
/// missing: "libcuda.so.1: cannot open shared object file (no NVIDIA driver)",
/// "cuInit: CUDA_ERROR_NO_DEVICE (no CUDA-capable device is detected)".
const cuda_driver* cuda(std::string* why = nullptr) noexcept;

/// Loads the driver from `path` apart from the process's one (tests); never unloaded.
std::unique_ptr<cuda_driver> load_cuda_driver(const char* path, std::string& why);

/// Where a range of memory lives, for register_memory.
struct memory_placement {
    memory_type type = memory_type::host;
    int device = -1;             ///< CUDA device ordinal (device memory)
    std::size_t allocations = 0; ///< CUDA allocations the range spans (device memory)
};

/// Resolves `requested` for [addr, addr + length): memory_type::detect becomes host unless
/// the driver is in the process and calls it device memory. Device memory must lie in
/// mapped CUDA allocations (several, back to back, for CUDA virtual memory). Throws
/// rdmx::error from `verb`: not_supported without a driver or for managed memory,
/// invalid_argument for a range that is not device memory or runs past its allocations.
memory_placement place_memory(const void* addr, std::size_t length, memory_type requested, const char* verb);

/// A dma-buf for device memory [addr, addr + length), exported with
/// cuMemGetHandleForAddressRange over the host pages around it: `offset` is where addr
/// lies in it. Returns -1 and `why` when the driver or device cannot.
struct dmabuf_export {
    int fd = -1;
    std::uint64_t offset = 0;
};
dmabuf_export export_dmabuf(const void* addr, std::size_t length, int device, std::string& why) noexcept;

} // namespace rdmx::detail
