// Test main: besides running GoogleTest, it names the RDMA device the verbs run used and
// how many tests really ran on it (skips are counted apart, never as passes).
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "common/test_util.hpp"

namespace
{

class backend_report : public testing::EmptyTestEventListener
{
public:
    explicit backend_report(std::string device) : device_(std::move(device)) {}

    void OnTestEnd(const testing::TestInfo& info) override
    {
        std::string name = info.name();
        if (name.size() < 6 || name.compare(name.size() - 6, 6, "/verbs") != 0)
            return;
        const auto* r = info.result();
        if (r->Skipped())
            ++skipped_;
        else if (r->Passed())
            ++passed_;
        else
            ++failed_;
    }

    void OnTestProgramEnd(const testing::UnitTest&) override
    {
        if (passed_ + failed_ + skipped_ == 0)
            return;
        std::printf(
            "[rdmx] verbs backend on RDMA device %s: %d tests ran (%d passed, %d failed), %d skipped\n",
            device_.c_str(), passed_ + failed_, passed_, failed_, skipped_);
    }

private:
    std::string device_;
    int passed_ = 0, failed_ = 0, skipped_ = 0;
};

} // namespace

int main(int argc, char** argv)
{
    // A death test's child (re-executed with this flag) runs one test body only: it opens
    // no domain here, whose log line would read RDMX_LOG before the test does.
    bool death_test_child = false;
    for (int i = 1; i < argc; ++i)
        death_test_child |= std::string_view(argv[i]).starts_with("--gtest_internal_run_death_test");
    testing::InitGoogleTest(&argc, argv);
    std::string device = "(none)";
    for (auto b : death_test_child ? std::vector<rdmx::backend>{} : rdmx::test::selected_backends()) {
        std::string host = rdmx::test::host_for(b);
        if (host.empty()) {
            std::printf("[rdmx] backend %s selected but RDMX_TEST_RDMA_ADDR is unset\n", rdmx::to_string(b));
            continue;
        }
        try {
            auto d = rdmx::domain::open(rdmx::test::address(b, 0));
            std::printf(
                "[rdmx] backend %s: device %s, address %s, max_inline %u, max_sge %u, max_qp_rd_atom %u\n",
                rdmx::to_string(b), d->limits().device_name.c_str(), host.c_str(), d->limits().max_inline,
                d->limits().max_sge, d->limits().max_qp_rd_atom);
            if (b == rdmx::backend::verbs)
                device = d->limits().device_name;
        } catch (const std::exception& e) {
            std::printf("[rdmx] backend %s: cannot open a domain on %s: %s\n", rdmx::to_string(b),
                        host.c_str(), e.what());
            return 1;
        }
    }
    std::fflush(stdout);
    testing::UnitTest::GetInstance()->listeners().Append(new backend_report(device));
    return RUN_ALL_TESTS();
}
