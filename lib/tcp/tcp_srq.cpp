// The TCP shared receive queue: posting (the application), taking and retiring (the
// engines of the connections on it), and the low-watermark event.
#include "tcp/tcp_srq.hpp"

#include <algorithm>
#include <string>

#include "event_queue.hpp"
#include "validate.hpp"

namespace rdmx::tcp
{

tcp_srq::tcp_srq(std::shared_ptr<tcp_domain> dom, const shared_receive_queue_options& opts)
    : dom_(std::move(dom)), depth_(std::min(opts.depth, dom_->limits().max_qp_wr)),
      max_sge_(std::min(opts.max_sge, dom_->limits().max_sge)), events_(opts.events), context_(opts.context)
{
    if (opts.depth == 0 || opts.max_sge == 0)
        throw_error(errc::invalid_argument,
                    "create_shared_receive_queue: depth and max_sge must be at least 1");
    engine_lock lk(mu_);
    ring_.resize(depth_);
    segs_.resize(std::size_t{depth_} * max_sge_);
}

tcp_srq::~tcp_srq()
{
    if (events_)
        detail::impl(*events_).purge(nullptr, this);
}

std::error_code tcp_srq::post_recv(std::span<const recv_request> wrs, std::size_t* posted) noexcept
{
    if (posted)
        *posted = 0;
    connection_limits lim;
    lim.max_recv_sge = max_sge_;
    // All or nothing: an invalid request rejects the whole list before any is taken.
    for (const recv_request& wr : wrs) {
        std::uint64_t total = 0;
        if (errc ec = detail::check_recv(wr, dom_->owner(), lim, total); ec != errc{})
            return ec;
    }
    engine_lock lk(mu_);
    std::size_t i = 0;
    for (; i < wrs.size() && outstanding_.load(std::memory_order_relaxed) < depth_; ++i) {
        entry& e = ring_[tail_ % depth_];
        seg* segs = &segs_[(tail_ % depth_) * max_sge_];
        e.wr_id = wrs[i].wr_id;
        e.length = 0;
        e.nseg = 0;
        for (const sge& s : wrs[i].local) {
            if (s.length == 0)
                continue;
            segs[e.nseg++] = region_seg(*s.region, s.offset, s.length);
            e.length += s.length;
        }
        ++tail_;
        outstanding_.fetch_add(1, std::memory_order_relaxed);
    }
    if (posted)
        *posted = i;
    return i < wrs.size() ? make_error_code(errc::would_block) : std::error_code{};
}

std::error_code tcp_srq::arm_limit(std::uint32_t limit) noexcept
{
    if (!events_ || limit == 0 || limit > depth_)
        return errc::invalid_argument;
    engine_lock lk(mu_);
    limit_ = limit;
    return {};
}

std::shared_ptr<tcp_srq> tcp_srq::of(const connection_options& opts, const tcp_domain& dom,
                                     std::string_view what)
{
    if (!opts.srq)
        return nullptr;
    auto q = std::dynamic_pointer_cast<tcp_srq>(opts.srq);
    if (!q || &q->domain() != &dom)
        throw_error(errc::invalid_argument,
                    std::string(what) + ": the shared receive queue belongs to another domain");
    return q;
}

bool tcp_srq::take(std::uint64_t& wr_id, std::uint64_t& length, std::uint32_t& nseg, seg* segs) noexcept
{
    bool fire = false;
    {
        engine_lock lk(mu_);
        if (head_ == tail_)
            return false;
        const entry& e = ring_[head_ % depth_];
        const seg* from = &segs_[(head_ % depth_) * max_sge_];
        std::copy(from, from + e.nseg, segs);
        wr_id = e.wr_id;
        length = e.length;
        nseg = e.nseg;
        ++head_;
        // As a verbs device: checked as a receive is consumed, then disarmed.
        if (limit_ && tail_ - head_ < limit_) {
            limit_ = 0;
            fire = true;
        }
    }
    if (fire) {
        event ev;
        ev.type = event_type::srq_limit_reached;
        ev.context = context_;
        ev.srq = this;
        detail::impl(*events_).push(ev);
    }
    return true;
}

void tcp_srq::retire(std::size_t n) noexcept
{
    if (n == 0)
        return;
    // Never below zero (as before, under the lock): a count gone wrong must not wrap and
    // refuse every post from then on.
    std::uint32_t cur = outstanding_.load(std::memory_order_relaxed);
    while (!outstanding_.compare_exchange_weak(
        cur, cur - static_cast<std::uint32_t>(std::min<std::size_t>(n, cur)), std::memory_order_relaxed)) {
    }
}

} // namespace rdmx::tcp
