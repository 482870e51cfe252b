// The log (<rdmx/log.hpp>, lib/log.hpp): the level from RDMX_LOG, filtering, a user's
// sink, and the rate limit for peer-caused messages.
#include <gtest/gtest.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <rdmx/connection.hpp>
#include <rdmx/log.hpp>

#include "log.hpp"

namespace rdmx
{
namespace
{

struct message {
    log_level level;
    std::string text;
};

/// A sink that records what it receives, installed for the fixture's lifetime; the level
/// is restored afterwards too.
class log_fixture : public testing::Test
{
protected:
    void SetUp() override
    {
        saved_ = get_log_level();
        set_log_sink([this](log_level l, std::string_view text) {
            std::lock_guard lk(mu_);
            got_.push_back({l, std::string(text)});
        });
    }
    void TearDown() override
    {
        set_log_sink({});
        set_log_level(saved_);
    }
    std::vector<message> got()
    {
        std::lock_guard lk(mu_);
        return got_;
    }

    log_level saved_{};
    std::mutex mu_;
    std::vector<message> got_;
};

TEST(log_levels, names_parse_in_any_case_and_round_trip)
{
    for (auto l : {log_level::off, log_level::error, log_level::warn, log_level::info, log_level::debug,
                   log_level::trace}) {
        EXPECT_EQ(parse_log_level(to_string(l)), l) << to_string(l);
    }
    EXPECT_EQ(parse_log_level("DEBUG"), log_level::debug);
    EXPECT_EQ(parse_log_level("Warn"), log_level::warn);
    for (const char* bad : {"", "warning", "debug ", "3", "verbose", "errorx"})
        EXPECT_EQ(parse_log_level(bad), std::nullopt) << "'" << bad << "'";
}

TEST(log_levels, environment_value_or_the_fallback)
{
    bool unknown = true;
    EXPECT_EQ(detail::log_level_from_env(nullptr, log_level::warn, unknown), log_level::warn);
    EXPECT_FALSE(unknown);
    EXPECT_EQ(detail::log_level_from_env("", log_level::warn, unknown), log_level::warn);
    EXPECT_FALSE(unknown);
    EXPECT_EQ(detail::log_level_from_env("trace", log_level::warn, unknown), log_level::trace);
    EXPECT_FALSE(unknown);
    EXPECT_EQ(detail::log_level_from_env("loud", log_level::warn, unknown), log_level::warn);
    EXPECT_TRUE(unknown);
}

// The environment is read once per process, so these run in a fresh one: gtest's
// "threadsafe" death tests execute the test program again, with the environment set here.
class log_environment : public testing::Test
{
protected:
    void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
    void TearDown() override { ::unsetenv("RDMX_LOG"); }
};

TEST_F(log_environment, rdmx_log_sets_the_level)
{
    ::setenv("RDMX_LOG", "debug", 1);
    EXPECT_EXIT(
        {
            bool ok = get_log_level() == log_level::debug && detail::log_enabled(log_level::debug) &&
                      !detail::log_enabled(log_level::trace);
            std::_Exit(ok ? 0 : 1);
        },
        testing::ExitedWithCode(0), "");
    ::setenv("RDMX_LOG", "OFF", 1);
    EXPECT_EXIT(std::_Exit(get_log_level() == log_level::off ? 0 : 1), testing::ExitedWithCode(0), "");
}

TEST_F(log_environment, default_level_is_warn)
{
    ::unsetenv("RDMX_LOG");
    EXPECT_EXIT(
        {
            RDMX_LOG(warn, "a warning");
            RDMX_LOG(info, "not shown");
            std::_Exit(get_log_level() == log_level::warn ? 0 : 1);
        },
        testing::ExitedWithCode(0), "^rdmx: a warning\n$");
}

TEST_F(log_environment, unknown_value_is_reported_once_and_the_default_applies)
{
    ::setenv("RDMX_LOG", "loud", 1);
    EXPECT_EXIT(
        {
            int reports = 0;
            set_log_sink([&](log_level, std::string_view t) {
                if (t.find("RDMX_LOG=loud is not a level") != std::string_view::npos)
                    ++reports;
            });
            bool ok = get_log_level() == log_level::warn;
            RDMX_LOG(warn, "one");
            ok = ok && get_log_level() == log_level::warn;
            set_log_sink({});
            std::_Exit(ok && reports == 1 ? 0 : 1);
        },
        testing::ExitedWithCode(0), "");
    // The default sink's line, as an operator sees it.
    EXPECT_EXIT(
        {
            (void)get_log_level();
            (void)get_log_level();
            std::_Exit(0);
        },
        testing::ExitedWithCode(0), "^rdmx: RDMX_LOG=loud is not a level \\(.*\\); using warn\n$");
}

TEST_F(log_environment, set_log_level_wins_over_the_environment)
{
    ::setenv("RDMX_LOG", "trace", 1);
    EXPECT_EXIT(
        {
            set_log_level(log_level::error); // before anything read the environment
            std::_Exit(get_log_level() == log_level::error ? 0 : 1);
        },
        testing::ExitedWithCode(0), "");
}

TEST_F(log_fixture, the_sink_receives_what_passes_the_level)
{
    set_log_level(log_level::info);
    RDMX_LOG(error, "e %d", 1);
    RDMX_LOG(warn, "w %s", "two");
    RDMX_LOG(info, "i");
    RDMX_LOG(debug, "d");
    RDMX_LOG(trace, "t");
    auto m = got();
    ASSERT_EQ(m.size(), 3u);
    EXPECT_EQ(m[0].level, log_level::error);
    EXPECT_EQ(m[0].text, "e 1");
    EXPECT_EQ(m[1].level, log_level::warn);
    EXPECT_EQ(m[1].text, "w two");
    EXPECT_EQ(m[2].level, log_level::info);
    EXPECT_EQ(m[2].text, "i");
}

TEST_F(log_fixture, opening_a_domain_says_which_backend_the_address_took)
{
    set_log_level(log_level::info);
    {
        auto d = domain::open("shm://log-test:0");
    }
    auto m = got();
    ASSERT_EQ(m.size(), 1u);
    EXPECT_EQ(m[0].level, log_level::info);
    EXPECT_EQ(m[0].text, "domain::open(shm://log-test:0): backend shm, device shm");
}

TEST_F(log_fixture, a_disabled_level_evaluates_no_argument)
{
    set_log_level(log_level::warn);
    int evaluated = 0;
    auto arg = [&] {
        ++evaluated;
        return 0;
    };
    RDMX_LOG(debug, "%d", arg());
    EXPECT_EQ(evaluated, 0);
    RDMX_LOG(warn, "%d", arg());
    EXPECT_EQ(evaluated, 1);
    set_log_level(log_level::off);
    RDMX_LOG(error, "%d", arg());
    EXPECT_EQ(evaluated, 1);
    EXPECT_EQ(got().size(), 1u);
}

TEST_F(log_fixture, long_messages_are_cut_not_overrun)
{
    set_log_level(log_level::warn);
    std::string big(3 * detail::log_line_max, 'x');
    RDMX_LOG(warn, "%s", big.c_str());
    auto m = got();
    ASSERT_EQ(m.size(), 1u);
    EXPECT_EQ(m[0].text, std::string(detail::log_line_max - 1, 'x'));
}

TEST_F(log_fixture, messages_from_many_threads_reach_the_sink_whole)
{
    set_log_level(log_level::warn);
    std::vector<std::thread> ts;
    for (int t = 0; t < 4; ++t)
        ts.emplace_back([t] {
            for (int i = 0; i < 100; ++i)
                RDMX_LOG(warn, "thread %d message %d", t, i);
        });
    for (auto& t : ts)
        t.join();
    auto m = got();
    ASSERT_EQ(m.size(), 400u);
    for (auto& x : m)
        EXPECT_EQ(x.text.rfind("thread ", 0), 0u) << x.text;
}

TEST_F(log_fixture, a_replaced_sink_is_no_longer_called)
{
    set_log_level(log_level::warn);
    int other = 0;
    set_log_sink([&](log_level, std::string_view) { ++other; });
    RDMX_LOG(warn, "to the other");
    set_log_sink([this](log_level l, std::string_view text) {
        std::lock_guard lk(mu_);
        got_.push_back({l, std::string(text)});
    });
    RDMX_LOG(warn, "back");
    EXPECT_EQ(other, 1);
    ASSERT_EQ(got().size(), 1u);
    EXPECT_EQ(got()[0].text, "back");
}

TEST_F(log_fixture, rate_limit_suppresses_and_then_reports_the_count)
{
    set_log_level(log_level::warn);
    // One line a second after a burst of 3: a loop of 20 takes far less than a second.
    static detail::log_rate_limit limit(1, 3);
    for (int i = 0; i < 20; ++i)
        detail::log_limited(limit, log_level::warn, "peer %d misbehaved", i);
    auto m = got();
    ASSERT_EQ(m.size(), 3u);
    EXPECT_EQ(m[2].text, "peer 2 misbehaved");
    EXPECT_EQ(limit.suppressed(), 17u);
    // Messages below the level neither take a token nor count.
    detail::log_limited(limit, log_level::debug, "quiet");
    EXPECT_EQ(limit.suppressed(), 17u);
    // After a token's time, the next line passes, preceded by the count of the dropped ones.
    std::this_thread::sleep_for(std::chrono::milliseconds(1100));
    detail::log_limited(limit, log_level::warn, "peer %d misbehaved", 20);
    m = got();
    ASSERT_EQ(m.size(), 5u);
    EXPECT_EQ(m[3].text, "17 similar messages suppressed (rate limit)");
    EXPECT_EQ(m[3].level, log_level::warn);
    EXPECT_EQ(m[4].text, "peer 20 misbehaved");
    // The count starts again after it was reported.
    detail::log_limited(limit, log_level::warn, "peer %d misbehaved", 21);
    EXPECT_EQ(got().size(), 5u);
    EXPECT_EQ(limit.suppressed(), 18u);
}

} // namespace
} // namespace rdmx
