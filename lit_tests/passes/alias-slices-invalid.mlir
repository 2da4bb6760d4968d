// RUN: pw-opt %s --split-input-file --verify-diagnostics --pw-alias-slices

// pw-alias-slices moves computations between slices; anything else that
// names a slice it aliases (written by pw-insert-transfers and pw-emit-plans,
// or by hand) would be left naming the old slice, so it is refused at that op.

// A transfer into @c, whose computations would move onto @a.
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1073741824, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {devices = array<i64: 0, 2>, island = "island0"}} : () -> ()
"pw.virtual_slice"() {sym_name = "b", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {devices = array<i64: 2, 4>, island = "island0"}} : () -> ()
"pw.virtual_slice"() {sym_name = "c", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {devices = array<i64: 0, 2>, island = "island0"}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program} {
  %0 = "pw.compute"(%x) {callee = @f, slice = @b, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "f#0"} : (tensor<8xf32>) -> tensor<8xf32>
  // expected-error@below {{'pw.transfer' op names @c, whose computations pw-alias-slices moves onto @a: it runs before pw-insert-transfers, which writes such references}}
  %1 = "pw.transfer"(%0) {link = "ici", src = @b, dst = @c, sharding = [["x"]]} : (tensor<8xf32>) -> tensor<8xf32>
  %2 = "pw.compute"(%1) {callee = @f, slice = @c, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "f#1"} : (tensor<8xf32>) -> tensor<8xf32>
  return %2 : tensor<8xf32>
}
}

// -----

// An argument the runtime would put on @c.
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1073741824, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {devices = array<i64: 0, 2>, island = "island0"}} : () -> ()
"pw.virtual_slice"() {sym_name = "c", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {devices = array<i64: 0, 2>, island = "island0"}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
// expected-error@below {{'func.func' op names @c, whose computations pw-alias-slices moves onto @a}}
func.func @main(%x: tensor<8xf32> {pw.home = {slice = @c, sharding = [["x"]]}}) -> tensor<8xf32> attributes {pw.program} {
  %0 = "pw.compute"(%x) {callee = @f, slice = @c, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "f#0"} : (tensor<8xf32>) -> tensor<8xf32>
  return %0 : tensor<8xf32>
}
}

// -----

// Plans name slices in their steps: they come after aliasing.
// expected-error@below {{pw-alias-slices runs on programs before their plans exist (pw-emit-plans), but this module holds plans}}
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1073741824, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {devices = array<i64: 0, 2>, island = "island0"}} : () -> ()
module @main_island0 attributes {pw.island_plan = {island = "island0", program = @main}} {
}
}
