// RUN: pw-opt %s --split-input-file --verify-diagnostics --pw-verify-schedule

// Each case is an order that could deadlock or is incomplete.

// Every op needs an order.
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1073741824, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 2>}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program, pw.subgraphs = [{id = 0, static = true}]} {
  // expected-error@below {{'pw.compute' op has no pw.order, which the scheduled phase requires (pw-schedule adds it), before pw-verify-schedule}}
  %0 = "pw.compute"(%x) {callee = @f, slice = @a, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "f#0", pw.subgraph = 0} : (tensor<8xf32>) -> tensor<8xf32>
  return %0 : tensor<8xf32>
}
}

// -----

// Slices must be placed to know the islands.
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1073741824, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
// expected-error@below {{'pw.virtual_slice' op has no pw.placement, which the scheduled phase requires (pw-place adds it), before pw-verify-schedule}}
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program, pw.subgraphs = [{id = 0, static = true}]} {
  %0 = "pw.compute"(%x) {callee = @f, slice = @a, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "f#0", pw.order = 0, pw.subgraph = 0} : (tensor<8xf32>) -> tensor<8xf32>
  return %0 : tensor<8xf32>
}
}

// -----

// An inconsistent pair: two programs' ops on island0 with the same order.
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1073741824, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 2>}} : () -> ()
"pw.virtual_slice"() {sym_name = "b", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 2, 4>}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
func.func @first(%x: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program, pw.subgraphs = [{id = 0, static = true}]} {
  %0 = "pw.compute"(%x) {callee = @f, slice = @a, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "f#0", pw.order = 0, pw.subgraph = 0} : (tensor<8xf32>) -> tensor<8xf32>
  return %0 : tensor<8xf32>
}
func.func @second(%x: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program, pw.subgraphs = [{id = 0, static = true}]} {
  // expected-error@below {{has pw.order 0 like 'f#0', and both run on island0: the island may enqueue them either way}}
  %0 = "pw.compute"(%x) {callee = @f, slice = @b, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "g#0", pw.order = 0, pw.subgraph = 0} : (tensor<8xf32>) -> tensor<8xf32>
  return %0 : tensor<8xf32>
}
}

// -----

// A consumer enqueued before its producer on the same island deadlocks.
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1073741824, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 2>}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program, pw.subgraphs = [{id = 0, static = true}]} {
  %0 = "pw.compute"(%x) {callee = @f, slice = @a, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "f#0", pw.order = 1, pw.subgraph = 0} : (tensor<8xf32>) -> tensor<8xf32>
  // expected-error@below {{is ordered 0 but uses a value of 'f#0', ordered 1: the schedule deadlocks in the cycle}}
  %1 = "pw.compute"(%0) {callee = @f, slice = @a, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "f#1", pw.order = 0, pw.subgraph = 0} : (tensor<8xf32>) -> tensor<8xf32>
  return %1 : tensor<8xf32>
}
}

// -----

// A deadlock across two islands: "b#0" waits for the transfer of "a#0"'s
// value, which island1 runs after "b#0". (Once lowered, every data edge joins
// two ops of one island, so an order that deadlocks always has a consumer
// ordered before what it uses.)
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1073741824, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}},
    {name = "island1", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1073741824, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 2>}} : () -> ()
"pw.virtual_slice"() {sym_name = "b", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island1", devices = array<i64: 0, 2>}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
func.func @p1(%x: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program, pw.subgraphs = [{id = 0, static = true}]} {
  %0 = "pw.compute"(%x) {callee = @f, slice = @a, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "a#0", pw.order = 1, pw.subgraph = 0} : (tensor<8xf32>) -> tensor<8xf32>
  %1 = "pw.transfer"(%0) {link = "dcn", src = @a, dst = @b, sharding = [["x"]], pw.order = 2, pw.subgraph = 0} : (tensor<8xf32>) -> tensor<8xf32>
  // expected-error@below {{'pw.compute' op is ordered 0 but uses a value of pw.transfer #2, ordered 2: the schedule deadlocks in the cycle}}
  %2 = "pw.compute"(%1) {callee = @f, slice = @b, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "b#0", pw.order = 0, pw.subgraph = 0} : (tensor<8xf32>) -> tensor<8xf32>
  return %2 : tensor<8xf32>
}
}
