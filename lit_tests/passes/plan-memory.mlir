// RUN: pw-opt %s --split-input-file --pw-emit-plans --pw-plan-memory --pw-verify | FileCheck %s

// pw-plan-memory frees every buffer after its last reader and records each
// island's static peak bytes per device range.

// Across islands: each buffer that is not a result is freed after its last
// reader (the send reads buffer 1); results (buffer 3) are never freed. The
// peak of island0 is the argument and f's result on devices [0, 2).
// CHECK-LABEL: module @main_island0 attributes {pw.island_plan = {island = "island0", program = @main}, pw.peak_bytes = array<i64: 0, 2, 32>}
// CHECK: "pw.launch"() {{.*}}step = 0 : i64
// CHECK-NEXT: "pw.free"() {after = array<i64: 0>, buffers = array<i64: 0>, step = 4 : i64, subgraph = 0 : i64}
// CHECK-NEXT: "pw.send"() {{.*}}step = 1 : i64
// CHECK-NEXT: "pw.free"() {after = array<i64: 1>, buffers = array<i64: 1>, step = 5 : i64, subgraph = 0 : i64}
// CHECK-LABEL: module @main_island1 attributes {pw.island_plan = {island = "island1", program = @main}, pw.peak_bytes = array<i64: 4, 6, 32>}
// CHECK: "pw.recv"()
// CHECK-NEXT: "pw.launch"() {{.*}}step = 3 : i64
// CHECK-NEXT: "pw.free"() {after = array<i64: 3>, buffers = array<i64: 2>, step = 6 : i64, subgraph = 0 : i64}
// CHECK-NEXT: {{^  }$}}
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 8, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}},
    {name = "island1", device_kind = "cpu", hosts = 1, devices_per_host = 8, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 2>}} : () -> ()
"pw.virtual_slice"() {sym_name = "b", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island1", devices = array<i64: 4, 6>}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
func.func @main(%x: tensor<8xf32> {pw.home = {slice = @a, sharding = [["x"]]}}) -> tensor<8xf32> attributes {pw.program, pw.subgraphs = [{id = 0, static = true}]} {
  %0 = "pw.compute"(%x) {callee = @f, slice = @a, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "f#0", pw.order = 0, pw.subgraph = 0} : (tensor<8xf32>) -> tensor<8xf32>
  %1 = "pw.transfer"(%0) {link = "dcn", src = @a, dst = @b, sharding = [["x"]], pw.order = 1, pw.subgraph = 0} : (tensor<8xf32>) -> tensor<8xf32>
  %2 = "pw.compute"(%1) {callee = @f, slice = @b, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "f#1", pw.order = 2, pw.subgraph = 0} : (tensor<8xf32>) -> tensor<8xf32>
  return %2 : tensor<8xf32>
}
}

// -----

// A buffer read by a host branch (the predicate, buffer 2) is freed after
// that branch (step 4); frees that fall at the same place are one step.
// The peak (41 bytes) is reached once the input is freed and the gathered
// copy (32 bytes) lives beside the predicate and g's result.
// CHECK-LABEL: module @then_island0 attributes {pw.island_plan = {island = "island0", program = @then}, pw.peak_bytes = array<i64: 0, 4, 16>}
// CHECK-LABEL: module @main_island0 attributes {pw.island_plan = {island = "island0", program = @main}, pw.peak_bytes = array<i64: 0, 4, 41>}
// CHECK: "pw.launch"() {{.*}}label = "g#0"
// CHECK-NEXT: "pw.free"() {after = array<i64: 1, 2>, buffers = array<i64: 0>, step = 6 : i64, subgraph = 0 : i64}
// CHECK-NEXT: "pw.copy"()
// CHECK-NEXT: "pw.free"() {after = array<i64: 3, 4>, buffers = array<i64: 2, 3>, step = 7 : i64, subgraph = 0 : i64}
// CHECK-NEXT: {{^  }$}}
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 8, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 4>, axes = ["x"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 4>}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
module @positive attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<i1> {
    %0 = "stablehlo.constant"() {value = dense<true> : tensor<i1>} : () -> tensor<i1>
    return %0 : tensor<i1>
  }
}
func.func @then(%x: tensor<8xf32> {pw.home = {slice = @a, sharding = [["x"]]}}) -> tensor<8xf32> attributes {pw.program, pw.subgraphs = [{id = 0, static = true}]} {
  %0 = "pw.compute"(%x) {callee = @f, slice = @a, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "t#0", pw.order = 0, pw.subgraph = 0} : (tensor<8xf32>) -> tensor<8xf32>
  return %0 : tensor<8xf32>
}
func.func @main(%x: tensor<8xf32> {pw.home = {slice = @a, sharding = [["x"]]}}, %y: tensor<8xf32>) -> (tensor<8xf32>, tensor<8xf32>) attributes {pw.program, pw.subgraphs = [{id = 0, static = true}, {id = 1, static = false}]} {
  %p = "pw.compute"(%x) {callee = @positive, slice = @a, in_shardings = [[["x"]]], out_shardings = [[]], label = "p#0", pw.order = 1, pw.subgraph = 0} : (tensor<8xf32>) -> tensor<i1>
  %0 = "pw.compute"(%x) {callee = @f, slice = @a, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "g#0", pw.order = 2, pw.subgraph = 0} : (tensor<8xf32>) -> tensor<8xf32>
  %1 = "pw.gather"(%0) {link = "ici", src = @a, dst = @a, src_sharding = [["x"]], dst_sharding = [[]], pieces = 4, piece_shape = array<i64: 2>, pw.order = 3, pw.subgraph = 0} : (tensor<8xf32>) -> tensor<8xf32>
  %2 = "pw.cond"(%p, %y) {then_program = @then, else_program = @then, label = "k#0", pw.result_homes = [{}], pw.order = 4, pw.subgraph = 0} : (tensor<i1>, tensor<8xf32>) -> tensor<8xf32>
  return %1, %2 : tensor<8xf32>, tensor<8xf32>
}
}

// -----

// A donated argument (pw.donated) whose last reader, f#1, writes a result
// laid out as it: the result takes the argument's buffer, so the peak is
// two 16-byte shards (the argument and f#0's result), not three; the host
// plan lists the donated input.
// CHECK-LABEL: module @main_island0 attributes {pw.island_plan = {island = "island0", program = @main}, pw.peak_bytes = array<i64: 0, 2, 32>}
// CHECK: module @main_host attributes {pw.host_plan = {donated = array<i64: 0>, inputs = array<i64: 0>
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 8, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 2>}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
module @g attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>, %y: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
func.func @main(%x: tensor<8xf32> {pw.home = {slice = @a, sharding = [["x"]]}, pw.donated}) -> tensor<8xf32> attributes {pw.program, pw.subgraphs = [{id = 0, static = true}]} {
  %0 = "pw.compute"(%x) {callee = @f, slice = @a, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "f#0", pw.order = 0, pw.subgraph = 0} : (tensor<8xf32>) -> tensor<8xf32>
  %1 = "pw.compute"(%x, %0) {callee = @g, slice = @a, in_shardings = [[["x"]], [["x"]]], out_shardings = [[["x"]]], label = "f#1", pw.order = 1, pw.subgraph = 0} : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
  return %1 : tensor<8xf32>
}
}
