// RUN: pw-opt %s --split-input-file --pw-emit-plans --pw-verify | FileCheck %s

// pw-emit-plans cuts one plan per island (and a host plan) out of a placed,
// lowered, scheduled program.

// Across islands: island0 launches and sends, island1 receives and launches;
// buffers are declared where they live with their size per device.
// CHECK-LABEL: module @main_island0 attributes {pw.island_plan = {island = "island0", program = @main}}
// CHECK-NEXT: "pw.buffer"() {bytes_per_device = 16 : i64, home = {sharding = {{\[\["x"\]\]}}, slice = @a}, id = 0 : i64, type = tensor<8xf32>}
// CHECK-NEXT: "pw.buffer"() {bytes_per_device = 16 : i64, home = {sharding = {{\[\["x"\]\]}}, slice = @a}, id = 1 : i64, type = tensor<8xf32>}
// CHECK-NEXT: "pw.launch"() {after = array<i64>, devices = array<i64: 0, 2>, executable = @f, inputs = array<i64: 0>, label = "f#0", output_bytes = array<i64: 16>, outputs = array<i64: 1>, slice = @a, step = 0 : i64, subgraph = 0 : i64}
// CHECK-NEXT: "pw.send"() {after = array<i64: 0>, buffer = 1 : i64, bytes = 16 : i64, devices = array<i64: 0, 2>, link = "dcn", peer = "island1", peer_buffer = 2 : i64, step = 1 : i64, subgraph = 0 : i64}
// CHECK-NEXT: {{^  }$}}
// CHECK-LABEL: module @main_island1 attributes {pw.island_plan = {island = "island1", program = @main}}
// CHECK-NEXT: "pw.buffer"() {{.*}}id = 2 : i64
// CHECK-NEXT: "pw.buffer"() {{.*}}id = 3 : i64
// CHECK-NEXT: "pw.recv"() {after = array<i64: 1>, buffer = 2 : i64, bytes = 16 : i64, devices = array<i64: 4, 6>, link = "dcn", peer = "island0", peer_buffer = 1 : i64, step = 2 : i64, subgraph = 0 : i64}
// CHECK-NEXT: "pw.launch"() {after = array<i64: 2>, devices = array<i64: 4, 6>, executable = @f, inputs = array<i64: 2>, label = "f#1", {{.*}}outputs = array<i64: 3>, slice = @b, step = 3 : i64
// CHECK-NEXT: {{^  }$}}
// CHECK-LABEL: module @main_host attributes {pw.host_plan = {inputs = array<i64: 0>, outputs = array<i64: 3>, program = @main, subgraphs = [{id = 0 : i64, static = true}]}}
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

// Inside one island, a reshard is a copy. A pw.cond is a host step that runs
// its branch programs' plans; host values (an input only the host reads, a
// branch result nothing uses on devices) are host buffers. Each program,
// branches included, gets its own plans, with step ids that follow pw.order
// across programs.
// CHECK-LABEL: module @then_island0
// CHECK: "pw.launch"() {{.*}}label = "t#0"
// CHECK-LABEL: module @then_host attributes {pw.host_plan = {inputs = array<i64: 0>, outputs = array<i64: 1>, program = @then
// CHECK-LABEL: module @main_island0
// CHECK: "pw.buffer"() {bytes_per_device = 8 : i64, home = {sharding = {{\[\["x"\]\]}}, slice = @a}, id = 3 : i64
// CHECK: "pw.buffer"() {bytes_per_device = 32 : i64, home = {sharding = {{\[\[\]\]}}, slice = @a}, id = 4 : i64
// CHECK: "pw.launch"() {{.*}}label = "p#0"{{.*}}step = 1
// CHECK-NEXT: "pw.launch"() {{.*}}label = "g#0"{{.*}}outputs = array<i64: 3>{{.*}}step = 2
// CHECK-NEXT: "pw.copy"() {after = array<i64: 2>, bytes = 32 : i64, dst_buffer = 4 : i64, link = "ici", src_buffer = 3 : i64, step = 3 : i64, subgraph = 0 : i64}
// CHECK-NEXT: {{^  }$}}
// CHECK-LABEL: module @main_host attributes {pw.host_plan = {inputs = array<i64: 0, 1>, outputs = array<i64: 4, 5>, program = @main, subgraphs = [{id = 0 : i64, static = true}, {id = 1 : i64, static = false}]}}
// CHECK-NEXT: "pw.buffer"() {bytes_per_device = 32 : i64, home = {}, id = 1 : i64, type = tensor<8xf32>}
// CHECK-NEXT: "pw.buffer"() {bytes_per_device = 32 : i64, home = {}, id = 5 : i64, type = tensor<8xf32>}
// CHECK-NEXT: "pw.branch"() {after = array<i64: 1>, else_program = @then, inputs = array<i64: 1>, label = "k#0", outputs = array<i64: 5>, pred = 2 : i64, step = 4 : i64, subgraph = 0 : i64, then_program = @then}
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

// A plan's name is @<program>_<island> (@<program>_host for the host plan)
// unless a symbol has it already, then with the first free `_N`: here an
// executable is named @main_host, and an island "host" (whose plan and the
// host plan shared a name, and their buffers and steps). Plans are found by
// their marks, not their names.
// CHECK-LABEL: module @main_host attributes {pw.executable}
// CHECK-LABEL: module @main_host_0 attributes {pw.island_plan = {island = "host", program = @main}}
// CHECK-NEXT: "pw.buffer"() {{.*}}id = 0 : i64
// CHECK-NEXT: "pw.buffer"() {{.*}}id = 1 : i64
// CHECK-NEXT: "pw.launch"() {{.*}}label = "f#0"
// CHECK-NEXT: {{^  }$}}
// CHECK-LABEL: module @main_host_1 attributes {pw.host_plan = {inputs = array<i64: 0>, outputs = array<i64: 1>, program = @main
// CHECK-NEXT: {{^  }$}}
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "host", device_kind = "cpu", hosts = 1, devices_per_host = 8, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "host", devices = array<i64: 0, 2>}} : () -> ()
module @main_host attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
func.func @main(%x: tensor<8xf32> {pw.home = {slice = @a, sharding = [["x"]]}}) -> tensor<8xf32> attributes {pw.program, pw.subgraphs = [{id = 0, static = true}]} {
  %0 = "pw.compute"(%x) {callee = @main_host, slice = @a, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "f#0", pw.order = 0, pw.subgraph = 0} : (tensor<8xf32>) -> tensor<8xf32>
  return %0 : tensor<8xf32>
}
}
