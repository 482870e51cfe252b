// What the two halves of the sample pair share: waiting for one request's completion, and
// the bulk transfer's data pattern and checksum (the client checks what the server wrote).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include <rdmx/rdmx.hpp>

namespace sample
{

/// Waits (event mode) for the completion of one work request at a time. Completions of
/// other requests that arrive first are kept for their own wait. One per connection.
class completion_waiter
{
public:
    completion_waiter(rdmx::connection& c, std::chrono::milliseconds timeout) : conn_(c), timeout_(timeout) {}

    /// The completion of `wr_id`; throws a clear message naming `what` on an error
    /// completion (of any request) or when nothing arrives in time.
    rdmx::completion wait(std::uint64_t wr_id, const char* what)
    {
        auto deadline = std::chrono::steady_clock::now() + timeout_;
        for (;;) {
            for (auto it = early_.begin(); it != early_.end(); ++it) {
                if (it->wr_id != wr_id && !it->status)
                    continue;
                rdmx::completion wc = *it;
                early_.erase(it);
                if (wc.status)
                    throw std::runtime_error(std::string(what) + ": " + wc.status.message());
                return wc;
            }
            auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                deadline - std::chrono::steady_clock::now());
            rdmx::completion wc;
            if (left.count() <= 0 || conn_.wait({&wc, 1}, left) == 0)
                throw std::runtime_error(std::string(what) + ": no completion within " +
                                         std::to_string(timeout_.count()) + " ms (peer dead?)");
            early_.push_back(wc);
        }
    }

private:
    rdmx::connection& conn_;
    std::chrono::milliseconds timeout_;
    std::vector<rdmx::completion> early_;
};

/// Byte i of the data the server writes into the client's buffer.
inline std::byte bulk_pattern(std::size_t i)
{
    return static_cast<std::byte>((i * 7 + (i >> 12)) & 0xff);
}

/// FNV-1a over n bytes: the server sends it with DONE, the client recomputes it.
inline std::uint64_t checksum(const std::byte* p, std::size_t n)
{
    std::uint64_t h = 1469598103934665603ull;
    for (std::size_t i = 0; i < n; ++i)
        h = (h ^ static_cast<std::uint8_t>(p[i])) * 1099511628211ull;
    return h;
}

} // namespace sample
