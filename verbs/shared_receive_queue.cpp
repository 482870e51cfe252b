// Set-up, posting and slot accounting of a verbs shared receive queue.
#include "verbs/shared_receive_queue.hpp"

#include <algorithm>
#include <cerrno>
#include <string>

#include "event_queue.hpp"
#include "validate.hpp"
#include "verbs/verbs_connection.hpp"

namespace rdmx::verbs
{

shared_receive_queue::shared_receive_queue(const protection_domain& pd, std::shared_ptr<const void> keepalive,
                                           const shared_receive_queue_options& opts)
    : keepalive_(std::move(keepalive)), pd_(pd), events_(opts.events), context_(opts.context)
{
    const char* verb = "create_shared_receive_queue";
    if (opts.depth == 0 || opts.max_sge == 0)
        throw_error(errc::invalid_argument, std::string(verb) + ": depth and max_sge must be at least 1");
    ibv_device_attr attr{};
    if (int rc = ibv_query_device(pd.native_context(), &attr))
        throw_errno(rc, "ibv_query_device");
    if (attr.max_srq <= 0 || attr.max_srq_wr <= 0 || attr.max_srq_sge <= 0)
        throw_error(errc::not_supported, std::string(verb) + ": device " + pd.limits().device_name +
                                             " has no shared receive queues");
    depth_ = std::min(opts.depth, static_cast<std::uint32_t>(attr.max_srq_wr));
    max_sge_ = std::min({opts.max_sge, static_cast<std::uint32_t>(attr.max_srq_sge), max_sge_per_wr});

    wr_ids_.resize(depth_);
    free_.resize(depth_);
    for (std::uint32_t i = 0; i < depth_; ++i)
        free_[i] = depth_ - 1 - i; // slot 0 on top
    nfree_ = depth_;
    wrs_.resize(post_batch);
    sges_.resize(post_batch * max_sge_);
    for (std::size_t i = 0; i < post_batch; ++i)
        wrs_[i].sg_list = sges_.data() + i * max_sge_;

    ibv_srq_init_attr init{};
    init.srq_context = this;
    init.attr.max_wr = depth_;
    init.attr.max_sge = max_sge_;
    errno = 0; // providers may fail without one (throw_errno says so)
    srq_.reset(ibv_create_srq(pd.native_pd(), &init));
    if (!srq_)
        throw_errno(errno, "ibv_create_srq");
}

shared_receive_queue::~shared_receive_queue()
{
    if (events_)
        detail::impl(*events_).purge(nullptr, this);
}

std::error_code shared_receive_queue::post_recv(std::span<const recv_request> wrs,
                                                std::size_t* posted) noexcept
{
    if (posted)
        *posted = 0;
    connection_limits lim;
    lim.max_recv_sge = max_sge_;
    // Validate the whole list first: a bad request must not leave half a list posted.
    for (const recv_request& wr : wrs) {
        std::uint64_t total = 0;
        if (errc ec = detail::check_recv(wr, &pd_, lim, total); ec != errc{})
            return ec;
    }
    std::lock_guard lock(mu_);
    const std::size_t take = std::min(wrs.size(), nfree_);
    std::size_t done = 0;
    std::error_code ec;
    while (done < take) {
        const std::size_t n = std::min(post_batch, take - done);
        for (std::size_t i = 0; i < n; ++i) {
            const recv_request& wr = wrs[done + i];
            const std::uint32_t slot = free_[--nfree_];
            wr_ids_[slot] = wr.wr_id;
            ibv_recv_wr& w = wrs_[i];
            w.wr_id = reinterpret_cast<std::uintptr_t>(&wr_ids_[slot]);
            w.num_sge = static_cast<int>(wr.local.size());
            for (std::size_t j = 0; j < wr.local.size(); ++j) {
                const sge& s = wr.local[j];
                w.sg_list[j].addr = reinterpret_cast<std::uintptr_t>(s.region->data() + s.offset);
                w.sg_list[j].length = static_cast<std::uint32_t>(s.length);
                w.sg_list[j].lkey = s.region->local_key();
            }
            w.next = i + 1 < n ? &wrs_[i + 1] : nullptr;
        }
        ibv_recv_wr* bad = nullptr;
        int rc = ibv_post_srq_recv(srq_.get(), wrs_.data(), &bad);
        if (rc || bad) [[unlikely]] {
            // The provider names the first request it did not take; those from there on
            // give their slots back (in reverse, so the stack is as before).
            std::size_t ok =
                bad >= wrs_.data() && bad < wrs_.data() + n ? static_cast<std::size_t>(bad - wrs_.data()) : 0;
            for (std::size_t i = n; i-- > ok;)
                free_[nfree_++] = static_cast<std::uint32_t>(
                    (wrs_[i].wr_id - reinterpret_cast<std::uintptr_t>(wr_ids_.data())) /
                    sizeof(std::uint64_t));
            done += ok;
            if (rc < 0)
                rc = -rc; // libsiw returns a negative errno
            ec = rc == ENOMEM              ? make_error_code(errc::would_block)
                 : rc == EINVAL || rc == 0 ? make_error_code(errc::invalid_argument)
                                           : std::error_code(rc, std::system_category());
            break;
        }
        done += n;
    }
    if (posted)
        *posted = done;
    if (!ec && done < wrs.size())
        return errc::would_block;
    return ec;
}

std::uint64_t shared_receive_queue::complete(std::uint64_t wr_id) noexcept
{
    const auto slot = static_cast<std::uint32_t>((wr_id - reinterpret_cast<std::uintptr_t>(wr_ids_.data())) /
                                                 sizeof(std::uint64_t));
    std::lock_guard lock(mu_);
    free_[nfree_++] = slot;
    return wr_ids_[slot];
}

std::error_code shared_receive_queue::arm_limit(std::uint32_t limit) noexcept
{
    if (!events_ || limit == 0 || limit > depth_)
        return errc::invalid_argument;
    ibv_srq_attr attr{};
    attr.srq_limit = limit;
    if (int rc = ibv_modify_srq(srq_.get(), &attr, IBV_SRQ_LIMIT))
        return {rc < 0 ? -rc : rc, std::system_category()};
    return {};
}

void shared_receive_queue::limit_reached() noexcept
{
    if (!events_)
        return;
    event ev;
    ev.type = event_type::srq_limit_reached;
    ev.context = context_;
    ev.srq = this;
    detail::impl(*events_).push(ev);
}

} // namespace rdmx::verbs
