// Records the library's log lines while it lives (a sink of its own, at a level of its
// own); the previous level is restored and the sink removed when it goes. The sink is
// process-wide: one at a time.
#pragma once

#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include <rdmx/log.hpp>

namespace rdmx::test
{

class log_lines
{
public:
    explicit log_lines(log_level level = log_level::info) : saved_(get_log_level())
    {
        set_log_level(level);
        set_log_sink([this](log_level l, std::string_view text) {
            std::lock_guard lk(mu_);
            lines_.push_back({l, std::string(text)});
        });
    }
    ~log_lines()
    {
        set_log_sink({});
        set_log_level(saved_);
    }
    log_lines(const log_lines&) = delete;
    log_lines& operator=(const log_lines&) = delete;

    /// Whether a line contains `part`.
    bool has(std::string_view part)
    {
        std::lock_guard lk(mu_);
        for (const auto& l : lines_)
            if (l.text.find(part) != std::string::npos)
                return true;
        return false;
    }
    /// The lines of level `l` that contain `part`, in order.
    std::vector<std::string> matching(log_level l, std::string_view part)
    {
        std::lock_guard lk(mu_);
        std::vector<std::string> out;
        for (const auto& x : lines_)
            if (x.level == l && x.text.find(part) != std::string::npos)
                out.push_back(x.text);
        return out;
    }

private:
    struct line {
        log_level level;
        std::string text;
    };
    log_level saved_;
    std::mutex mu_;
    std::vector<line> lines_;
};

} // namespace rdmx::test
