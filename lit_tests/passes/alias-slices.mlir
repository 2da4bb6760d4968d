// RUN: pw-opt %s --split-input-file --pw-alias-slices | FileCheck %s
// RUN: pw-opt %s --split-input-file --pass-pipeline='builtin.module(pw-alias-slices,pw-insert-transfers)' | FileCheck %s --check-prefix=MOVE

// pw-alias-slices: slices placed on the same devices with the same mesh shape
// share one mesh, so a value in the same layout moves nothing. Each case is
// already placed (as pw-place leaves it).

// @c sits on @a's devices with @a's mesh shape: c's computation moves to @a,
// its axis "x" written "data". The value made by a#0 is used by c#0 where it
// already is: no transfer, not even an ICI copy.
// CHECK-LABEL: module attributes {pw.topology
// CHECK: "pw.virtual_slice"() {{.*}}sym_name = "a"
// CHECK: "pw.virtual_slice"() {axes = ["x"], constraints = {}, pw.alias = @a, {{.*}}sym_name = "c"
// CHECK: "pw.compute"(%arg0) {{.*}}label = "a#0"{{.*}}slice = @a
// CHECK: "pw.compute"(%0) {callee = @tanh, in_shardings = {{\[\[\["data"\], \[\]\]\]}}, label = "c#0", out_shardings = {{\[\[\["data"\], \[\]\]\]}}, slice = @a}
// MOVE-LABEL: func.func @same
// MOVE-NOT: "pw.transfer"
// MOVE-NOT: "pw.gather"
// MOVE: "pw.compute"(%0) {{.*}}label = "c#0"
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1073741824, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["data"], constraints = {}, pw.placement = {devices = array<i64: 0, 2>, island = "island0"}} : () -> ()
"pw.virtual_slice"() {sym_name = "c", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {devices = array<i64: 0, 2>, island = "island0"}} : () -> ()
module @tanh attributes {pw.executable} {
  func.func public @main(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
    %0 = "stablehlo.tanh"(%x) : (tensor<8x16xf32>) -> tensor<8x16xf32>
    return %0 : tensor<8x16xf32>
  }
}
func.func @same(%x: tensor<8x16xf32>) -> tensor<8x16xf32> attributes {pw.program} {
  %a = "pw.compute"(%x) {callee = @tanh, slice = @a, in_shardings = [[["data"], []]], out_shardings = [[["data"], []]], label = "a#0"} : (tensor<8x16xf32>) -> tensor<8x16xf32>
  %c = "pw.compute"(%a) {callee = @tanh, slice = @c, in_shardings = [[["x"], []]], out_shardings = [[["x"], []]], label = "c#0"} : (tensor<8x16xf32>) -> tensor<8x16xf32>
  return %c : tensor<8x16xf32>
}
}

// -----

// The same devices, but @c splits columns where @a split rows: the layouts
// differ, so a reshard remains (over ICI, inside the one mesh).
// CHECK-LABEL: module attributes {pw.topology
// CHECK: "pw.compute"(%0) {callee = @tanh, in_shardings = {{\[\[\[\], \["data"\]\]\]}}, label = "c#0", {{.*}}slice = @a}
// MOVE-LABEL: func.func @transposed
// MOVE: "pw.gather"(%0) {dst = @a, dst_sharding = {{\[\[\], \[\]\]}}, link = "ici", {{.*}}src = @a, src_sharding = {{\[\["data"\], \[\]\]}}}
// MOVE-NEXT: "pw.scatter"(%1) {dst = @a, dst_sharding = {{\[\[\], \["data"\]\]}}, link = "ici", {{.*}}src = @a, src_sharding = {{\[\[\], \[\]\]}}}
// MOVE-NEXT: "pw.compute"(%2) {{.*}}label = "c#0"
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1073741824, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["data"], constraints = {}, pw.placement = {devices = array<i64: 0, 2>, island = "island0"}} : () -> ()
"pw.virtual_slice"() {sym_name = "c", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {devices = array<i64: 0, 2>, island = "island0"}} : () -> ()
module @tanh attributes {pw.executable} {
  func.func public @main(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
    %0 = "stablehlo.tanh"(%x) : (tensor<8x16xf32>) -> tensor<8x16xf32>
    return %0 : tensor<8x16xf32>
  }
}
func.func @transposed(%x: tensor<8x16xf32>) -> tensor<8x16xf32> attributes {pw.program} {
  %a = "pw.compute"(%x) {callee = @tanh, slice = @a, in_shardings = [[["data"], []]], out_shardings = [[["data"], []]], label = "a#0"} : (tensor<8x16xf32>) -> tensor<8x16xf32>
  %c = "pw.compute"(%a) {callee = @tanh, slice = @c, in_shardings = [[[], ["x"]]], out_shardings = [[[], ["x"]]], label = "c#0"} : (tensor<8x16xf32>) -> tensor<8x16xf32>
  return %c : tensor<8x16xf32>
}
}

// -----

// Not aliases: other devices ([2, 4)), or the same devices in another mesh
// shape (2x2 against 4). The computations stay and the values are copied.
// CHECK-LABEL: module attributes {pw.topology
// CHECK-NOT: pw.alias
// CHECK: label = "b#0"{{.*}}slice = @b
// CHECK: label = "d#0"{{.*}}slice = @d
// MOVE-LABEL: func.func @distinct
// MOVE: "pw.transfer"(%0) {dst = @b, link = "ici", sharding = {{.*}}, src = @a}
// MOVE: "pw.scatter"(%5) {dst = @d, {{.*}}link = "ici", {{.*}}src = @w, {{.*}}}
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 4, device_memory_bytes = 1073741824, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {devices = array<i64: 0, 2>, island = "island0"}} : () -> ()
"pw.virtual_slice"() {sym_name = "b", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {devices = array<i64: 2, 4>, island = "island0"}} : () -> ()
"pw.virtual_slice"() {sym_name = "w", shape = array<i64: 4>, axes = ["x"], constraints = {}, pw.placement = {devices = array<i64: 0, 4>, island = "island0"}} : () -> ()
"pw.virtual_slice"() {sym_name = "d", shape = array<i64: 2, 2>, axes = ["x", "y"], constraints = {}, pw.placement = {devices = array<i64: 0, 4>, island = "island0"}} : () -> ()
module @tanh attributes {pw.executable} {
  func.func public @main(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
    %0 = "stablehlo.tanh"(%x) : (tensor<8x16xf32>) -> tensor<8x16xf32>
    return %0 : tensor<8x16xf32>
  }
}
func.func @distinct(%x: tensor<8x16xf32>) -> tensor<8x16xf32> attributes {pw.program} {
  %a = "pw.compute"(%x) {callee = @tanh, slice = @a, in_shardings = [[["x"], []]], out_shardings = [[["x"], []]], label = "a#0"} : (tensor<8x16xf32>) -> tensor<8x16xf32>
  %b = "pw.compute"(%a) {callee = @tanh, slice = @b, in_shardings = [[["x"], []]], out_shardings = [[["x"], []]], label = "b#0"} : (tensor<8x16xf32>) -> tensor<8x16xf32>
  %w = "pw.compute"(%b) {callee = @tanh, slice = @w, in_shardings = [[["x"], []]], out_shardings = [[["x"], []]], label = "w#0"} : (tensor<8x16xf32>) -> tensor<8x16xf32>
  %d = "pw.compute"(%w) {callee = @tanh, slice = @d, in_shardings = [[["x"], ["y"]]], out_shardings = [[["x"], ["y"]]], label = "d#0"} : (tensor<8x16xf32>) -> tensor<8x16xf32>
  return %d : tensor<8x16xf32>
}
}
