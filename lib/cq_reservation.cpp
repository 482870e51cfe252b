// The reservation ledger of shared completion queues (lib/cq_reservation.hpp).
#include "cq_reservation.hpp"

#include <algorithm>
#include <string>

namespace rdmx::detail
{

std::uint32_t completion_queue_base::reserved() const noexcept
{
    std::lock_guard lk(mu_);
    return reserved_;
}

void completion_queue_base::reserve(std::uint32_t n, const shared_receive_queue* srq, std::string_view verb,
                                    std::string_view role, std::string_view why)
{
    std::lock_guard lk(mu_);
    auto ref = srq ? std::find_if(srq_refs_.begin(), srq_refs_.end(), [&](auto& r) { return r.first == srq; })
                   : srq_refs_.end();
    const bool first_of_srq = srq && ref == srq_refs_.end();
    const std::uint64_t want = std::uint64_t{n} + (first_of_srq ? srq->depth() : 0);
    if (want > depth_ - reserved_)
        throw error(make_error_code(errc::no_resources),
                    std::string(verb) + ": no room on the shared " + std::string(role) + " (depth " +
                        std::to_string(depth_) + ", " + std::to_string(reserved_) + " reserved) for " +
                        std::to_string(want) + " more entries (" + std::string(why) + ")");
    if (first_of_srq)
        srq_refs_.emplace_back(srq, 1); // may throw: nothing reserved yet
    else if (srq)
        ++ref->second;
    reserved_ += static_cast<std::uint32_t>(want);
}

void completion_queue_base::release(std::uint32_t n, const shared_receive_queue* srq) noexcept
{
    std::lock_guard lk(mu_);
    std::uint32_t give = n;
    if (srq) {
        auto ref = std::find_if(srq_refs_.begin(), srq_refs_.end(), [&](auto& r) { return r.first == srq; });
        if (ref != srq_refs_.end() && --ref->second == 0) {
            give += srq->depth();
            srq_refs_.erase(ref);
        }
    }
    reserved_ -= std::min(give, reserved_);
}

namespace
{

std::shared_ptr<completion_queue_base> typed(const std::shared_ptr<completion_queue>& q, rdmx::backend b,
                                             std::string_view verb, const char* role)
{
    if (!q)
        return nullptr;
    if (q->backend() != b)
        throw error(make_error_code(errc::invalid_argument),
                    std::string(verb) + ": the " + role + " belongs to the " + to_string(q->backend()) +
                        " backend, the connection to " + to_string(b));
    // Every queue of a backend is that backend's completion_queue_base.
    return std::static_pointer_cast<completion_queue_base>(q);
}

} // namespace

cq_reservation::cq_reservation(const connection_options& opts, const connection_limits& lim, rdmx::backend b,
                               std::string_view verb)
{
    auto send = typed(opts.send_cq, b, verb, "send_cq");
    auto recv = typed(opts.recv_cq, b, verb, "recv_cq");
    if (send) {
        send->reserve(lim.send_queue_depth + own_send_entries, nullptr, verb, "send_cq",
                      "send_queue_depth + 1");
        send_ = std::move(send);
        send_n_ = lim.send_queue_depth + own_send_entries;
    }
    if (recv) {
        // With a shared receive queue, its depth bounds the receive completions of every
        // connection on it together: reserved once per queue (rdmx/queues.hpp).
        const shared_receive_queue* srq = opts.srq.get();
        const std::uint32_t n = srq ? 0 : lim.recv_queue_depth;
        try {
            recv->reserve(n, srq, verb, "recv_cq",
                          srq ? "the depth of its shared receive queue" : "recv_queue_depth");
        } catch (...) {
            release(); // the destructor of a half-built object does not run
            throw;
        }
        recv_ = std::move(recv);
        recv_n_ = srq ? srq->depth() : n;
        srq_ = srq;
    }
}

cq_reservation::~cq_reservation()
{
    release();
}

cq_reservation::cq_reservation(cq_reservation&& o) noexcept
    : send_(std::move(o.send_)), recv_(std::move(o.recv_)), send_n_(o.send_n_), recv_n_(o.recv_n_),
      srq_(o.srq_)
{
    o.send_n_ = o.recv_n_ = 0;
    o.srq_ = nullptr;
}

cq_reservation& cq_reservation::operator=(cq_reservation&& o) noexcept
{
    if (this != &o) {
        release();
        send_ = std::move(o.send_);
        recv_ = std::move(o.recv_);
        send_n_ = o.send_n_;
        recv_n_ = o.recv_n_;
        srq_ = o.srq_;
        o.send_n_ = o.recv_n_ = 0;
        o.srq_ = nullptr;
    }
    return *this;
}

void cq_reservation::release() noexcept
{
    if (send_)
        send_->release(send_n_, nullptr);
    if (recv_)
        recv_->release(srq_ ? 0 : recv_n_, srq_);
    send_.reset();
    recv_.reset();
}

} // namespace rdmx::detail
