// RUN: pw-opt %s --split-input-file --pass-pipeline='builtin.module(pw-place{explain=true})' | FileCheck %s
// RUN: pw-opt %s --split-input-file --pass-pipeline='builtin.module(pw-place{strategy=spread})' | FileCheck %s --check-prefix=SPREAD
// RUN: pw-opt %s --split-input-file --pass-pipeline='builtin.module(pw-lower)' | FileCheck %s --check-prefix=LOWER

// strategy=auto (the default) places slices to minimise the estimated step
// time; explain=true shows each slice's estimated compute and transfer time
// and the best other place for it. Each case carries its topology.

// The three-block chain: load balancing (spread) sends B to island1, two DCN
// hops; auto keeps all three on island0, where A -> B -> C are ICI copies,
// and says B on island1 would make the step about 100x longer.
// CHECK-LABEL: module attributes {pw.topology
// CHECK: pw.placement = {devices = array<i64: 0, 2>, island = "island0"}, pw.placement_cost = {compute_ns = 31 : i64, runner_up = {devices = array<i64: 2, 4>, island = "island0", step_ns = 2108 : i64}, step_ns = 2108 : i64, transfer_ns = 0 : i64}, {{.*}}sym_name = "a"
// CHECK: pw.placement = {devices = array<i64: 0, 4>, island = "island0"}, pw.placement_cost = {compute_ns = 15 : i64, runner_up = {devices = array<i64: 0, 4>, island = "island1", step_ns = 200405 : i64}, step_ns = 2108 : i64, transfer_ns = 1010 : i64}, {{.*}}sym_name = "b"
// CHECK: pw.placement = {devices = array<i64: 2, 4>, island = "island0"}, {{.*}}sym_name = "c"
// SPREAD-LABEL: module attributes {pw.topology
// SPREAD: pw.placement = {devices = array<i64: 0, 2>, island = "island0"}, {{.*}}sym_name = "a"
// SPREAD: pw.placement = {devices = array<i64: 0, 4>, island = "island1"}, {{.*}}sym_name = "b"
// SPREAD: pw.placement = {devices = array<i64: 2, 4>, island = "island0"}, {{.*}}sym_name = "c"
// Lowered, the chain has no send or recv: island0 alone runs it.
// LOWER-LABEL: func.func @chain
// LOWER-NOT: "dcn"
// LOWER: module @chain_island0
// LOWER-NOT: module @chain_island1
// LOWER: module @chain_host
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1073741824, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}},
    {name = "island1", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1073741824, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["data"], constraints = {}} : () -> ()
"pw.virtual_slice"() {sym_name = "b", shape = array<i64: 2, 2>, axes = ["data", "model"], constraints = {}} : () -> ()
"pw.virtual_slice"() {sym_name = "c", shape = array<i64: 2>, axes = ["data"], constraints = {}} : () -> ()
module @tanh attributes {pw.executable} {
  func.func public @main(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
    %0 = "stablehlo.tanh"(%x) : (tensor<8x16xf32>) -> tensor<8x16xf32>
    return %0 : tensor<8x16xf32>
  }
}
func.func @chain(%x: tensor<8x16xf32>) -> tensor<8x16xf32> attributes {pw.program} {
  %a = "pw.compute"(%x) {callee = @tanh, slice = @a, in_shardings = [[["data"], []]], out_shardings = [[["data"], []]], label = "a#0"} : (tensor<8x16xf32>) -> tensor<8x16xf32>
  %b = "pw.compute"(%a) {callee = @tanh, slice = @b, in_shardings = [[["data"], ["model"]]], out_shardings = [[["data"], ["model"]]], label = "b#0"} : (tensor<8x16xf32>) -> tensor<8x16xf32>
  %c = "pw.compute"(%b) {callee = @tanh, slice = @c, in_shardings = [[["data"], []]], out_shardings = [[["data"], []]], label = "c#0"} : (tensor<8x16xf32>) -> tensor<8x16xf32>
  return %c : tensor<8x16xf32>
}
}

// -----

// Contention: two heavy computations of the same input in parallel. Sharing
// island0's devices would run them one after the other; auto gives each an
// island, as its runner-up figures show (about twice the step).
// CHECK-LABEL: module attributes {pw.topology
// CHECK: pw.placement = {devices = array<i64: 0, 4>, island = "island0"}, pw.placement_cost = {compute_ns = [[C:[0-9]+]] : i64, runner_up = {devices = array<i64: 0, 4>, island = "island1", {{.*}}sym_name = "left"
// CHECK: pw.placement = {devices = array<i64: 0, 4>, island = "island1"}, pw.placement_cost = {compute_ns = [[C]] : i64, runner_up = {devices = array<i64: 0, 4>, island = "island0", {{.*}}sym_name = "right"
// Spread does the same, for load.
// SPREAD-LABEL: module attributes {pw.topology
// SPREAD: pw.placement = {devices = array<i64: 0, 4>, island = "island1"}, {{.*}}sym_name = "right"
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1073741824, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}},
    {name = "island1", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1073741824, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
"pw.virtual_slice"() {sym_name = "left", shape = array<i64: 4>, axes = ["x"], constraints = {}} : () -> ()
"pw.virtual_slice"() {sym_name = "right", shape = array<i64: 4>, axes = ["x"], constraints = {}} : () -> ()
module @matmul attributes {pw.executable} {
  func.func public @main(%x: tensor<512x512xf32>) -> tensor<512x512xf32> {
    %0 = "stablehlo.dot_general"(%x, %x) {dot_dimension_numbers = #stablehlo.dot<lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]>} : (tensor<512x512xf32>, tensor<512x512xf32>) -> tensor<512x512xf32>
    return %0 : tensor<512x512xf32>
  }
}
func.func @both(%x: tensor<512x512xf32>) -> (tensor<512x512xf32>, tensor<512x512xf32>) attributes {pw.program} {
  %l = "pw.compute"(%x) {callee = @matmul, slice = @left, in_shardings = [[["x"], []]], out_shardings = [[["x"], []]], label = "left#0"} : (tensor<512x512xf32>) -> tensor<512x512xf32>
  %r = "pw.compute"(%x) {callee = @matmul, slice = @right, in_shardings = [[["x"], []]], out_shardings = [[["x"], []]], label = "right#0"} : (tensor<512x512xf32>) -> tensor<512x512xf32>
  return %l, %r : tensor<512x512xf32>, tensor<512x512xf32>
}
}

// -----

// Islands the DCN does not join: auto puts B (TPU) on the TPU island that A's
// island reaches; spread would take island1, from which no link leads to A.
// CHECK-LABEL: module attributes {pw.topology
// CHECK: pw.placement = {devices = array<i64: 0, 4>, island = "island0"}, {{.*}}sym_name = "a"
// CHECK: pw.placement = {devices = array<i64: 0, 4>, island = "island2"}, pw.placement_cost = {{{.*}}runner_up = {devices = array<i64: 0, 4>, island = "island1", step_ns = -1 : i64}{{.*}}sym_name = "b"
// SPREAD-LABEL: module attributes {pw.topology
// SPREAD: pw.placement = {devices = array<i64: 0, 4>, island = "island1"}, {{.*}}sym_name = "b"
// LOWER-LABEL: func.func @cross
// LOWER: "pw.transfer"(%{{.*}}) {dst = @b, link = "dcn", {{.*}}src = @a}
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, dcn_pairs = [["island0", "island2"]], islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1073741824, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}},
    {name = "island1", device_kind = "tpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1073741824, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}},
    {name = "island2", device_kind = "tpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1073741824, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 4>, axes = ["x"], constraints = {device_kind = "cpu"}} : () -> ()
"pw.virtual_slice"() {sym_name = "b", shape = array<i64: 4>, axes = ["x"], constraints = {device_kind = "tpu"}} : () -> ()
module @tanh attributes {pw.executable} {
  func.func public @main(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
    %0 = "stablehlo.tanh"(%x) : (tensor<8x16xf32>) -> tensor<8x16xf32>
    return %0 : tensor<8x16xf32>
  }
}
func.func @cross(%x: tensor<8x16xf32>) -> tensor<8x16xf32> attributes {pw.program} {
  %a = "pw.compute"(%x) {callee = @tanh, slice = @a, in_shardings = [[["x"], []]], out_shardings = [[["x"], []]], label = "a#0"} : (tensor<8x16xf32>) -> tensor<8x16xf32>
  %b = "pw.compute"(%a) {callee = @tanh, slice = @b, in_shardings = [[["x"], []]], out_shardings = [[["x"], []]], label = "b#0"} : (tensor<8x16xf32>) -> tensor<8x16xf32>
  return %b : tensor<8x16xf32>
}
}

// -----

// Memory: a's computation needs 4096 bytes per device (a 2048-byte shard in
// and one out), more than island0's devices hold, so every strategy puts it
// on island1.
// CHECK-LABEL: module attributes {pw.topology
// CHECK: pw.placement = {devices = array<i64: 0, 2>, island = "island1"}, {{.*}}sym_name = "a"
// SPREAD-LABEL: module attributes {pw.topology
// SPREAD: pw.placement = {devices = array<i64: 0, 2>, island = "island1"}, {{.*}}sym_name = "a"
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 4095, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}},
    {name = "island1", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 4096, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()
module @tanh attributes {pw.executable} {
  func.func public @main(%x: tensor<64x16xf32>) -> tensor<64x16xf32> {
    %0 = "stablehlo.tanh"(%x) : (tensor<64x16xf32>) -> tensor<64x16xf32>
    return %0 : tensor<64x16xf32>
  }
}
func.func @big(%x: tensor<64x16xf32>) -> tensor<64x16xf32> attributes {pw.program} {
  %a = "pw.compute"(%x) {callee = @tanh, slice = @a, in_shardings = [[["x"], []]], out_shardings = [[["x"], []]], label = "a#0"} : (tensor<64x16xf32>) -> tensor<64x16xf32>
  return %a : tensor<64x16xf32>
}
}

// -----

// A loop whose trip count is not static is counted once, and explain says so.
// CHECK-LABEL: module attributes {pw.topology
// CHECK: pw.placement_cost = {{{.*}}unknown_trip_counts = 1 : i64}, {{.*}}sym_name = "a"
// SPREAD-LABEL: module attributes {pw.topology
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1073741824, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()
module @until attributes {pw.executable} {
  func.func public @main(%a: tensor<4xf32>) -> tensor<4xf32> {
    %0 = "stablehlo.while"(%a) ({
    ^bb0(%x: tensor<4xf32>):
      %c = "stablehlo.constant"() {value = dense<true> : tensor<i1>} : () -> tensor<i1>
      "stablehlo.return"(%c) : (tensor<i1>) -> ()
    }, {
    ^bb0(%x: tensor<4xf32>):
      %y = "stablehlo.multiply"(%x, %x) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
      "stablehlo.return"(%y) : (tensor<4xf32>) -> ()
    }) : (tensor<4xf32>) -> tensor<4xf32>
    return %0 : tensor<4xf32>
  }
}
func.func @loop(%x: tensor<4xf32>) -> tensor<4xf32> attributes {pw.program} {
  %0 = "pw.compute"(%x) {callee = @until, slice = @a, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "a#0"} : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}
}
