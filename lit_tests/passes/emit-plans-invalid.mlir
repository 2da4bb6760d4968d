// RUN: pw-opt %s --split-input-file --verify-diagnostics --pw-emit-plans

// Each case is a module pw-emit-plans cannot cut into plans.

// The module must be placed first.
// expected-error@below {{the module has no pw.topology, which the scheduled phase requires (pw-place adds it), before pw-emit-plans}}
module {
}

// -----

// Every op needs its place in the schedule.
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 8, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 2>}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program, pw.subgraphs = [{id = 0, static = true}]} {
  // expected-error@below {{'pw.compute' op has no pw.order, which the scheduled phase requires (pw-schedule adds it), before pw-emit-plans}}
  %0 = "pw.compute"(%x) {pw.subgraph = 0, callee = @f, slice = @a, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "f#0"} : (tensor<8xf32>) -> tensor<8xf32>
  return %0 : tensor<8xf32>
}
}

// -----

// A program whose branches lead back to it has no finite plan.
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 8, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
func.func @main(%p: tensor<i1>) -> tensor<i1> attributes {pw.program, pw.subgraphs = [{id = 0, static = true}]} {
  // expected-error@below {{'pw.cond' op makes program @main reach itself (@main -> @loop -> @main): a plan cannot contain itself}}
  %0 = "pw.cond"(%p, %p) {then_program = @loop, else_program = @loop, label = "k#0", pw.order = 0, pw.subgraph = 0} : (tensor<i1>, tensor<i1>) -> tensor<i1>
  return %0 : tensor<i1>
}
func.func @loop(%p: tensor<i1>) -> tensor<i1> attributes {pw.program, pw.subgraphs = [{id = 0, static = true}]} {
  %0 = "pw.cond"(%p, %p) {then_program = @main, else_program = @main, label = "k#1", pw.order = 1, pw.subgraph = 0} : (tensor<i1>, tensor<i1>) -> tensor<i1>
  return %0 : tensor<i1>
}
}

// -----

// Plans name islands of the module's topology, which pw-place records.
// expected-error@below {{the module has no pw.topology, which the scheduled phase requires (pw-place adds it), before pw-emit-plans}}
module {
}

// -----

// A malformed topology is reported, not trusted.
// expected-error@below {{pw.topology: islands[0].ici: missing 'bandwidth_gbps'}}
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 8, device_memory_bytes = 1024, ici = {latency_us = 1.0}}]}} {
}

// -----

// A module that holds plans: writing them again dropped pw-plan-memory's frees
// and peaks, and pw-run ran the result reserving no memory.
// expected-error@below {{pw-emit-plans runs on programs before their plans exist, but this module holds plans already (pw-emit-plans has run)}}
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 8, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 2>}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
func.func @main(%x: tensor<8xf32> {pw.home = {slice = @a, sharding = [["x"]]}}) -> tensor<8xf32> attributes {pw.program, pw.subgraphs = [{id = 0, static = true}]} {
  %0 = "pw.compute"(%x) {pw.subgraph = 0, pw.order = 0, callee = @f, slice = @a, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "f#0"} : (tensor<8xf32>) -> tensor<8xf32>
  return %0 : tensor<8xf32>
}
module @main_host attributes {pw.host_plan = {program = @main, inputs = array<i64: 0>, outputs = array<i64: 1>, subgraphs = [{id = 0, static = true}]}} {
}
}
