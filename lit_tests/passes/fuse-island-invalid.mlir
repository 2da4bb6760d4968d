// RUN: pw-opt %s --split-input-file --verify-diagnostics --pw-fuse-island

// Each case is a module pw-fuse-island cannot work on.

// Fusion needs the data movement made explicit (pw-insert-transfers).
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [{device_kind = "cpu", device_memory_bytes = 1073741824, devices_per_host = 4, hosts = 1, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}, name = "island0"}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["d"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 2>}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program, pw.subgraphs = [{id = 0, static = true}]} {
  %0 = "pw.compute"(%x) {callee = @f, slice = @a, in_shardings = [[["d"]]], out_shardings = [[["d"]]], label = "f#0", pw.subgraph = 0} : (tensor<8xf32>) -> tensor<8xf32>
  // expected-error@below {{'pw.compute' op operand #0 lives on @a with sharding [["d"]], but the op uses it on @a with sharding [[]]: the partitioned phase requires every operand where it is used (pw-insert-transfers moves it), before pw-fuse-island}}
  %1 = "pw.compute"(%0) {callee = @f, slice = @a, in_shardings = [[[]]], out_shardings = [[["d"]]], label = "f#1", pw.subgraph = 0} : (tensor<8xf32>) -> tensor<8xf32>
  return %1 : tensor<8xf32>
}
}

// -----

// Fusion needs to know where every slice is (pw-place).
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [{device_kind = "cpu", device_memory_bytes = 1073741824, devices_per_host = 4, hosts = 1, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}, name = "island0"}]}} {
// expected-error@below {{'pw.virtual_slice' op has no pw.placement, which the partitioned phase requires (pw-place adds it), before pw-fuse-island}}
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["d"], constraints = {}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program, pw.subgraphs = [{id = 0, static = true}]} {
  %0 = "pw.compute"(%x) {callee = @f, slice = @a, in_shardings = [[["d"]]], out_shardings = [[["d"]]], label = "f#0", pw.subgraph = 0} : (tensor<8xf32>) -> tensor<8xf32>
  return %0 : tensor<8xf32>
}
}

// -----

// Fusion stays inside static subgraphs, so they must be marked first.
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [{device_kind = "cpu", device_memory_bytes = 1073741824, devices_per_host = 4, hosts = 1, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}, name = "island0"}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["d"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 2>}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
// expected-error@below {{program @main has no pw.subgraphs, which the partitioned phase requires (pw-mark-static-subgraphs adds it), before pw-fuse-island}}
func.func @main(%x: tensor<8xf32> {pw.home = {slice = @a, sharding = [["d"]]}}) -> tensor<8xf32> attributes {pw.program} {
  // expected-error@below {{'pw.compute' op has no pw.subgraph, which the partitioned phase requires (pw-mark-static-subgraphs adds it), before pw-fuse-island}}
  %0 = "pw.compute"(%x) {callee = @f, slice = @a, in_shardings = [[["d"]]], out_shardings = [[["d"]]], label = "f#0"} : (tensor<8xf32>) -> tensor<8xf32>
  return %0 : tensor<8xf32>
}
}

// -----

// A fused executable of pw-fuse-launches is not one the fused executable
// can call: pw-fuse-island runs first.
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [{device_kind = "cpu", device_memory_bytes = 1073741824, devices_per_host = 4, hosts = 1, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}, name = "island0"}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["d"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 2>}} : () -> ()
"pw.virtual_slice"() {sym_name = "b", shape = array<i64: 2, 2>, axes = ["d", "m"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 4>}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
module @fused_f_0 attributes {pw.executable, pw.fused = {calls = [{callee = @f, operands = array<i64: 0>, results = 1}, {callee = @f, operands = array<i64: 1>, results = 1}], results = array<i64: 2>}} {
  func.func private @main(tensor<8xf32>) -> tensor<8xf32>
}
func.func @main(%x: tensor<8xf32> {pw.home = {slice = @a, sharding = [["d"]]}}) -> tensor<8xf32> attributes {pw.program, pw.subgraphs = [{id = 0, static = true}]} {
  // expected-error@below {{pw-fuse-island cannot call fused executable @fused_f_0: run it before pw-fuse-launches}}
  %0 = "pw.compute"(%x) {callee = @fused_f_0, slice = @a, in_shardings = [[["d"]]], out_shardings = [[["d"]]], label = "f#0+f#1", pw.subgraph = 0} : (tensor<8xf32>) -> tensor<8xf32>
  %1 = "pw.scatter"(%0) {src = @a, dst = @b, src_sharding = [["d"]], dst_sharding = [["d", "m"]], pieces = 2, piece_shape = array<i64: 2>, link = "ici", pw.subgraph = 0} : (tensor<8xf32>) -> tensor<8xf32>
  %2 = "pw.compute"(%1) {callee = @f, slice = @b, in_shardings = [[["d", "m"]]], out_shardings = [[["d", "m"]]], label = "f#2", pw.subgraph = 0} : (tensor<8xf32>) -> tensor<8xf32>
  return %2 : tensor<8xf32>
}
}
