// The multi-process launchers' flags and plans (cli/tensor_parallel.h,
// cli/data_parallel.h, cli/expert_parallel.h): vLLM's and torchrun's flag names parse
// into the options, impossible combinations are one error naming the flag, each
// data-parallel engine gets its own tensor-parallel rendezvous, and a node's engines
// join the expert-parallel group over real gloo connections on the loopback.
#include <gtest/gtest.h>

#include <CLI/CLI.hpp>
#include <string>
#include <thread>
#include <vector>

#include "cli/data_parallel.h"
#include "cli/expert_parallel.h"
#include "cli/tensor_parallel.h"
#include "test_support/net.h"

namespace dserve::cli {
namespace {

struct Parsed {
  TensorParallelOptions tp;
  DataParallelOptions dp;
};

// Parses a `dserve serve` style command line with both groups of flags.
Parsed parse(std::vector<std::string> args) {
  Parsed p;
  CLI::App app;
  add_tensor_parallel_options(&app, &p.tp);
  add_data_parallel_options(&app, &p.dp);
  std::vector<const char*> argv = {"dserve"};
  for (const std::string& a : args) argv.push_back(a.c_str());
  app.parse(static_cast<int>(argv.size()), argv.data());
  p.dp.enable_expert_parallel = p.tp.expert_parallel;
  return p;
}

// The headless node of a two-node DeepSeek-R1 deployment (vllm-ascend's command).
TEST(LaunchFlags, TwoNodeHeadlessCommandLineParses) {
  Parsed p = parse({"--tensor-parallel-size", "4", "--data-parallel-size", "4",
                    "--data-parallel-size-local", "2", "--data-parallel-start-rank", "2",
                    "--data-parallel-address", "10.0.0.1", "--data-parallel-rpc-port", "13389",
                    "--headless", "--enable-expert-parallel"});
  EXPECT_EQ(p.tp.size, 4);
  EXPECT_TRUE(p.tp.expert_parallel);
  EXPECT_EQ(p.dp.size, 4);
  EXPECT_EQ(p.dp.size_local, 2);
  EXPECT_EQ(p.dp.start_rank, 2);
  EXPECT_EQ(p.dp.address, "10.0.0.1");
  EXPECT_EQ(p.dp.rpc_port, 13389);
  EXPECT_TRUE(p.dp.headless);
  EXPECT_TRUE(validate_data_parallel(&p.dp, p.tp.size).ok());
  EXPECT_TRUE(validate_tensor_parallel(p.tp).ok());
}

TEST(LaunchFlags, DefaultsAreVllmsAndTorchrunsOnOneNode) {
  Parsed p = parse({});
  EXPECT_EQ(p.tp.size, 1);
  EXPECT_EQ(p.tp.nnodes, 1);
  EXPECT_EQ(p.tp.master_port, 29500);
  EXPECT_EQ(p.dp.rpc_port, 29550);
  ASSERT_TRUE(validate_data_parallel(&p.dp, 1).ok());
  EXPECT_EQ(p.dp.size_local, 1);  // all of them, on the API server's node
}

void expect_error(const Status& s, const std::string& needle) {
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
}

TEST(LaunchFlags, TensorParallelMistakesNameTheFlag) {
  expect_error(validate_tensor_parallel(parse({"--tensor-parallel-size", "4", "--nnodes", "3"}).tp),
               "--nnodes 3 must divide --tensor-parallel-size 4");
  expect_error(validate_tensor_parallel(parse({"--nnodes", "2", "--tensor-parallel-size", "2",
                                               "--node-rank", "2"}).tp),
               "--node-rank 2 is outside [0, 2)");
  expect_error(validate_tensor_parallel(parse({"--master-port", "70000"}).tp), "--master-port");
  expect_error(validate_tensor_parallel(parse({"--distributed-timeout", "0"}).tp),
               "--distributed-timeout must be positive");
}

TEST(LaunchFlags, DataParallelMistakesNameTheFlag) {
  auto check = [](std::vector<std::string> args, int tp, const std::string& needle) {
    Parsed p = parse(std::move(args));
    expect_error(validate_data_parallel(&p.dp, tp), needle);
  };
  check({"--data-parallel-size", "2", "--data-parallel-size-local", "3"}, 1,
        "--data-parallel-size-local 3 is more than --data-parallel-size 2");
  check({"--data-parallel-size", "2", "--headless"}, 1, "--headless needs --data-parallel-address");
  check({"--data-parallel-size", "2", "--headless", "--data-parallel-address", "h",
         "--data-parallel-start-rank", "1", "--data-parallel-size-local", "2"}, 1,
        "data-parallel ranks 1..2");
  check({"--data-parallel-size", "2", "--data-parallel-start-rank", "1"}, 1, "without --headless");
  check({"--additional-config", "[1, 2]"}, 1, "--additional-config: not a JSON object");
  check({"--data-parallel-size", "2", "--enable-expert-parallel", "--data-parallel-rpc-port",
         "65534"}, 2, "65534 + 2 is not a port");
}

TEST(LaunchPlan, EachEngineMeetsItsRanksOnItsOwnPort) {
  Parsed p = parse({"--tensor-parallel-size", "2", "--data-parallel-size", "4",
                    "--data-parallel-address", "10.0.0.1", "--data-parallel-rpc-port", "13389",
                    "--enable-expert-parallel", "--master-port", "29600"});
  ASSERT_TRUE(validate_data_parallel(&p.dp, p.tp.size).ok());
  for (int dp_rank = 0; dp_rank < 4; ++dp_rank) {
    TensorParallelOptions e = engine_tensor_parallel(p.tp, p.dp, dp_rank);
    EXPECT_EQ(e.master_port, 29600 + dp_rank);
    EXPECT_EQ(e.master_addr, "127.0.0.1");  // an engine's ranks are on one node
    EXPECT_EQ(e.nnodes, 1);
    EXPECT_EQ(e.dp_rank, dp_rank);
    EXPECT_EQ(e.expert_dp_size, 4);
    EXPECT_EQ(e.expert_addr, "10.0.0.1");
    EXPECT_EQ(e.expert_port, 13389 + 2);
  }
  EXPECT_EQ(expert_parallel_port(p.dp), 13389 + 1);
  Parsed no_ep = parse({"--tensor-parallel-size", "2", "--data-parallel-size", "4"});
  EXPECT_EQ(engine_tensor_parallel(no_ep.tp, no_ep.dp, 1).expert_dp_size, 1);
}

// Both engines of one node join the expert-parallel group concurrently and can reduce.
TEST(ExpertParallelGroup, ANodesEnginesConnectAndReduce) {
  Parsed p = parse({"--data-parallel-size", "2", "--enable-expert-parallel"});
  p.dp.rpc_port = test::free_port() - 1;  // the group meets at rpc_port + 1
  ASSERT_TRUE(validate_data_parallel(&p.dp, 1).ok());
  auto comms = connect_expert_parallel(p.dp, "same model", 20);
  ASSERT_TRUE(comms.ok()) << comms.status().message();
  ASSERT_EQ(comms->size(), 2u);
  std::vector<float> a = {1, 2}, b = {10, 20};
  std::thread other([&] { EXPECT_TRUE((*comms)[1]->all_reduce_sum(b).ok()); });
  EXPECT_TRUE((*comms)[0]->all_reduce_sum(a).ok());
  other.join();
  EXPECT_EQ(a, (std::vector<float>{11, 22}));
  EXPECT_EQ(b, a);
  EXPECT_EQ((*comms)[0]->rank(), 0);
  EXPECT_EQ((*comms)[1]->size(), 2);
}

// An engine whose peer never comes gets an error that says how the nodes must agree.
TEST(ExpertParallelGroup, AMissingNodeIsNamedAfterTheTimeout) {
  Parsed p = parse({"--data-parallel-size", "2", "--data-parallel-size-local", "1",
                    "--enable-expert-parallel"});
  p.dp.rpc_port = test::free_port() - 1;
  ASSERT_TRUE(validate_data_parallel(&p.dp, 1).ok());
  auto comms = connect_expert_parallel(p.dp, "same model", 0.5);
  ASSERT_FALSE(comms.ok());
  EXPECT_NE(comms.status().message().find("every node needs --enable-expert-parallel"),
            std::string::npos) << comms.status().message();
}

}  // namespace
}  // namespace dserve::cli
