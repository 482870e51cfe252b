// The environment switches that turn a shm:// mechanism off in a process, for comparison
// runs (RDMX_SHM_RING, RDMX_SHM_CMA, RDMX_SHM_MAP; docs/shm.md).
#pragma once

#include <cstdlib>
#include <cstring>

namespace rdmx::tcp
{

/// False if the variable `name` is "off" or "0"; true otherwise (unset included). Callers
/// read it once and keep the answer.
inline bool env_switch_on(const char* name) noexcept
{
    const char* v = std::getenv(name);
    return !(v && (std::strcmp(v, "off") == 0 || std::strcmp(v, "0") == 0));
}

} // namespace rdmx::tcp
