// RUN: pw-opt %s --split-input-file --pw-insert-transfers --pw-verify | FileCheck %s

// pw-insert-transfers makes every change of device set or sharding explicit.
// Slices are placed by hand: island0 and island1 of 8 devices each.

// The same slice and sharding: nothing moves. A value used on a slice of the
// same island moves over ICI, on another island over DCN; two uses in the same
// place share one transfer.
// CHECK-LABEL: func.func @links
// CHECK: %[[A:.*]] = "pw.compute"(%arg0) {{.*}}slice = @a
// CHECK-NEXT: %[[A2:.*]] = "pw.compute"(%[[A]]) {{.*}}slice = @a
// CHECK-NEXT: %[[T:.*]] = "pw.transfer"(%[[A2]]) {dst = @b, link = "ici", sharding = {{\[\["x"\]\]}}, src = @a}
// CHECK-NEXT: %[[B:.*]] = "pw.compute"(%[[T]]) {{.*}}slice = @b
// CHECK-NEXT: %[[D:.*]] = "pw.transfer"(%[[B]]) {dst = @c, link = "dcn", sharding = {{\[\["x"\]\]}}, src = @b}
// CHECK-NEXT: "pw.compute"(%[[D]]) {{.*}}slice = @c
// CHECK-NEXT: "pw.compute"(%[[D]]) {{.*}}slice = @c
// CHECK-NOT: pw.transfer
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 8, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}},
    {name = "island1", device_kind = "cpu", hosts = 1, devices_per_host = 8, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 2>}} : () -> ()
"pw.virtual_slice"() {sym_name = "b", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 2, 4>}} : () -> ()
"pw.virtual_slice"() {sym_name = "c", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island1", devices = array<i64: 0, 2>}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
func.func @links(%x: tensor<8xf32>) -> (tensor<8xf32>, tensor<8xf32>) attributes {pw.program} {
  %0 = "pw.compute"(%x) {callee = @f, slice = @a, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "f#0"} : (tensor<8xf32>) -> tensor<8xf32>
  %1 = "pw.compute"(%0) {callee = @f, slice = @a, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "f#1"} : (tensor<8xf32>) -> tensor<8xf32>
  %2 = "pw.compute"(%1) {callee = @f, slice = @b, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "f#2"} : (tensor<8xf32>) -> tensor<8xf32>
  %3 = "pw.compute"(%2) {callee = @f, slice = @c, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "f#3"} : (tensor<8xf32>) -> tensor<8xf32>
  %4 = "pw.compute"(%2) {callee = @f, slice = @c, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "f#4"} : (tensor<8xf32>) -> tensor<8xf32>
  return %3, %4 : tensor<8xf32>, tensor<8xf32>
}
}

// -----

// 2-way to 4-way: each source shard is cut into 2 destination shards (scatter);
// 4-way to 2-way: each destination shard is assembled from 2 (gather).
// Exactly one exchange per change: each line must follow the last, so a duplicate fails.
// CHECK-LABEL: func.func @reshard
// CHECK: %[[C0:.*]] = "pw.compute"(%arg0) {{.*}}slice = @two
// CHECK-NEXT: %[[S:.*]] = "pw.scatter"(%[[C0]]) {dst = @four, dst_sharding = {{\[\["x"\], \[\]\]}}, link = "dcn", piece_shape = array<i64: 2, 4>, pieces = 2 : i64, src = @two, src_sharding = {{\[\["x"\], \[\]\]}}}
// CHECK-NEXT: %[[C1:.*]] = "pw.compute"(%[[S]]) {{.*}}slice = @four
// CHECK-NEXT: %[[G:.*]] = "pw.gather"(%[[C1]]) {dst = @two, dst_sharding = {{\[\["x"\], \[\]\]}}, link = "dcn", piece_shape = array<i64: 2, 4>, pieces = 2 : i64, src = @four, src_sharding = {{\[\["x"\], \[\]\]}}}
// CHECK-NEXT: %[[C2:.*]] = "pw.compute"(%[[G]]) {{.*}}slice = @two
// 2-way rows into 2x2 tiles on a 2-D mesh: each row block holds 2 tiles.
// CHECK-NEXT: %[[M:.*]] = "pw.scatter"(%[[C2]]) {dst = @mesh, dst_sharding = {{\[\["r"\], \["c"\]\]}}, link = "ici", piece_shape = array<i64: 4, 2>, pieces = 2 : i64, src = @two, src_sharding = {{\[\["x"\], \[\]\]}}}
// CHECK-NEXT: "pw.compute"(%[[M]]) {{.*}}slice = @mesh
// CHECK-NEXT: return
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 8, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}},
    {name = "island1", device_kind = "cpu", hosts = 1, devices_per_host = 8, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
"pw.virtual_slice"() {sym_name = "two", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 2>}} : () -> ()
"pw.virtual_slice"() {sym_name = "four", shape = array<i64: 4>, axes = ["x"], constraints = {}, pw.placement = {island = "island1", devices = array<i64: 0, 4>}} : () -> ()
"pw.virtual_slice"() {sym_name = "mesh", shape = array<i64: 2, 2>, axes = ["r", "c"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 4, 8>}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8x4xf32>) -> tensor<8x4xf32> { return %x : tensor<8x4xf32> }
}
func.func @reshard(%x: tensor<8x4xf32>) -> tensor<8x4xf32> attributes {pw.program} {
  %0 = "pw.compute"(%x) {callee = @f, slice = @two, in_shardings = [[["x"], []]], out_shardings = [[["x"], []]], label = "f#0"} : (tensor<8x4xf32>) -> tensor<8x4xf32>
  %1 = "pw.compute"(%0) {callee = @f, slice = @four, in_shardings = [[["x"], []]], out_shardings = [[["x"], []]], label = "f#1"} : (tensor<8x4xf32>) -> tensor<8x4xf32>
  %2 = "pw.compute"(%1) {callee = @f, slice = @two, in_shardings = [[["x"], []]], out_shardings = [[["x"], []]], label = "f#2"} : (tensor<8x4xf32>) -> tensor<8x4xf32>
  %3 = "pw.compute"(%2) {callee = @f, slice = @mesh, in_shardings = [[["r"], ["c"]]], out_shardings = [[["r"], ["c"]]], label = "f#3"} : (tensor<8x4xf32>) -> tensor<8x4xf32>
  return %3 : tensor<8x4xf32>
}
}

// -----

// Same devices, other sharding: resharding inside one slice (src == dst).
// Tilings that do not nest (rows to columns) go through a replicated copy.
// CHECK-LABEL: func.func @intra_slice
// CHECK: %[[R:.*]] = "pw.compute"
// CHECK-NEXT: %[[G:.*]] = "pw.gather"(%[[R]]) {dst = @m, dst_sharding = {{\[\[\], \[\]\]}}, link = "ici", piece_shape = array<i64: 4, 4>, pieces = 2 : i64, src = @m, src_sharding = {{\[\["x"\], \[\]\]}}}
// CHECK-NEXT: %[[R1:.*]] = "pw.compute"(%[[G]])
// CHECK-NEXT: %[[S:.*]] = "pw.scatter"(%[[R1]]) {dst = @m, dst_sharding = {{\[\["x"\], \["y"\]\]}}, link = "ici", piece_shape = array<i64: 4, 2>, pieces = 4 : i64, src = @m, src_sharding = {{\[\[\], \[\]\]}}}
// CHECK-NEXT: "pw.compute"(%[[S]])
// CHECK-NEXT: %[[W:.*]] = "pw.gather"(%[[R]]) {dst = @m, dst_sharding = {{\[\[\], \[\]\]}}, link = "ici", {{.*}}src = @m, src_sharding = {{\[\["x"\], \[\]\]}}}
// CHECK-NEXT: %[[C:.*]] = "pw.scatter"(%[[W]]) {dst = @m, dst_sharding = {{\[\[\], \["x"\]\]}}, link = "ici", piece_shape = array<i64: 8, 2>, pieces = 2 : i64, src = @m, src_sharding = {{\[\[\], \[\]\]}}}
// CHECK-NEXT: "pw.compute"(%[[C]])
// CHECK-NEXT: return
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 8, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
"pw.virtual_slice"() {sym_name = "m", shape = array<i64: 2, 2>, axes = ["x", "y"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 4>}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8x4xf32>) -> tensor<8x4xf32> { return %x : tensor<8x4xf32> }
}
func.func @intra_slice(%x: tensor<8x4xf32>) -> (tensor<8x4xf32>, tensor<8x4xf32>, tensor<8x4xf32>) attributes {pw.program} {
  %0 = "pw.compute"(%x) {callee = @f, slice = @m, in_shardings = [[["x"], []]], out_shardings = [[["x"], []]], label = "f#0"} : (tensor<8x4xf32>) -> tensor<8x4xf32>
  %1 = "pw.compute"(%0) {callee = @f, slice = @m, in_shardings = [[[], []]], out_shardings = [[[], []]], label = "f#1"} : (tensor<8x4xf32>) -> tensor<8x4xf32>
  %2 = "pw.compute"(%1) {callee = @f, slice = @m, in_shardings = [[["x"], ["y"]]], out_shardings = [[["x"], ["y"]]], label = "f#2"} : (tensor<8x4xf32>) -> tensor<8x4xf32>
  %3 = "pw.compute"(%0) {callee = @f, slice = @m, in_shardings = [[[], ["x"]]], out_shardings = [[[], ["x"]]], label = "f#3"} : (tensor<8x4xf32>) -> tensor<8x4xf32>
  return %1, %2, %3 : tensor<8x4xf32>, tensor<8x4xf32>, tensor<8x4xf32>
}
}

// -----

// Host values: an argument lives where it is first used (pw.home, beside its
// other attributes); its other uses move from there. A pw.cond's results
// likewise (pw.result_homes); its predicate and inputs are read by the host
// and never moved.
// CHECK-LABEL: func.func @host_values
// CHECK-SAME: (%arg0: tensor<i1>, %arg1: tensor<8xf32> {jax.arg_info = "x", pw.home = {sharding = {{\[\["x"\]\]}}, slice = @a}})
// CHECK: "pw.compute"(%arg1) {{.*}}slice = @a
// CHECK: %[[T:.*]] = "pw.transfer"(%arg1) {dst = @c, link = "dcn", sharding = {{\[\["x"\]\]}}, src = @a}
// CHECK: "pw.compute"(%[[T]]) {{.*}}slice = @c
// CHECK: %[[K:[0-9]+]]:2 = "pw.cond"(%arg0, %arg1, %arg1) {else_program = @id, label = "k#0", pw.result_homes = [{sharding = {{\[\[\]\]}}, slice = @c}, {}], then_program = @id}
// CHECK: "pw.compute"(%[[K]]#0) {{.*}}slice = @c
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 8, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}},
    {name = "island1", device_kind = "cpu", hosts = 1, devices_per_host = 8, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 2>}} : () -> ()
"pw.virtual_slice"() {sym_name = "c", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island1", devices = array<i64: 0, 2>}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
func.func @id(%x: tensor<8xf32>, %y: tensor<8xf32>) -> (tensor<8xf32>, tensor<8xf32>) attributes {pw.program} {
  return %x, %y : tensor<8xf32>, tensor<8xf32>
}
func.func @host_values(%p: tensor<i1>, %x: tensor<8xf32> {jax.arg_info = "x"}) -> (tensor<8xf32>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32>) attributes {pw.program} {
  %0 = "pw.compute"(%x) {callee = @f, slice = @a, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "f#0"} : (tensor<8xf32>) -> tensor<8xf32>
  %1 = "pw.compute"(%x) {callee = @f, slice = @c, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "f#1"} : (tensor<8xf32>) -> tensor<8xf32>
  %2:2 = "pw.cond"(%p, %x, %x) {then_program = @id, else_program = @id, label = "k#0"} : (tensor<i1>, tensor<8xf32>, tensor<8xf32>) -> (tensor<8xf32>, tensor<8xf32>)
  %3 = "pw.compute"(%2#0) {callee = @f, slice = @c, in_shardings = [[[]]], out_shardings = [[["x"]]], label = "f#2"} : (tensor<8xf32>) -> tensor<8xf32>
  return %0, %1, %3, %2#1 : tensor<8xf32>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32>
}
}

// -----

// The same tiling under other axis names: each destination shard is one whole
// source shard, a one-piece gather (not a gather to a replicated copy, then a
// scatter 1-way into 1-way, which pw-verify refuses). Here 1-device slices,
// as on a machine with one accelerator, whose specs name different axes; and
// 2x2 tiles whose axes swap places.
// CHECK-LABEL: func.func @renamed_tiling
// CHECK: %[[A:.*]] = "pw.compute"(%arg0) {{.*}}slice = @one
// CHECK-NEXT: %[[G:.*]] = "pw.gather"(%[[A]]) {dst = @one_by_one, dst_sharding = {{\[\["d"\], \["m"\]\]}}, link = "ici", piece_shape = array<i64: 8, 4>, pieces = 1 : i64, src = @one, src_sharding = {{\[\["d"\], \[\]\]}}}
// CHECK-NEXT: %[[B:.*]] = "pw.compute"(%[[G]]) {{.*}}slice = @one_by_one
// CHECK-NEXT: %[[T:.*]] = "pw.scatter"(%[[B]]) {dst = @mesh, dst_sharding = {{\[\["c"\], \["r"\]\]}}, link = "ici", piece_shape = array<i64: 4, 2>, pieces = 4 : i64, src = @one_by_one, src_sharding = {{\[\["d"\], \["m"\]\]}}}
// CHECK-NEXT: %[[M:.*]] = "pw.compute"(%[[T]]) {{.*}}slice = @mesh
// CHECK-NEXT: %[[S:.*]] = "pw.gather"(%[[M]]) {dst = @mesh, dst_sharding = {{\[\["r"\], \["c"\]\]}}, link = "ici", piece_shape = array<i64: 4, 2>, pieces = 1 : i64, src = @mesh, src_sharding = {{\[\["c"\], \["r"\]\]}}}
// CHECK-NEXT: "pw.compute"(%[[S]]) {{.*}}slice = @mesh
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [
    {name = "island0", device_kind = "cpu", hosts = 1, devices_per_host = 8, device_memory_bytes = 1024, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}}]}} {
"pw.virtual_slice"() {sym_name = "one", shape = array<i64: 1>, axes = ["d"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 1>}} : () -> ()
"pw.virtual_slice"() {sym_name = "one_by_one", shape = array<i64: 1, 1>, axes = ["d", "m"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 1>}} : () -> ()
"pw.virtual_slice"() {sym_name = "mesh", shape = array<i64: 2, 2>, axes = ["r", "c"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 4, 8>}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8x4xf32>) -> tensor<8x4xf32> { return %x : tensor<8x4xf32> }
}
func.func @renamed_tiling(%x: tensor<8x4xf32>) -> tensor<8x4xf32> attributes {pw.program} {
  %0 = "pw.compute"(%x) {callee = @f, slice = @one, in_shardings = [[["d"], []]], out_shardings = [[["d"], []]], label = "f#0"} : (tensor<8x4xf32>) -> tensor<8x4xf32>
  %1 = "pw.compute"(%0) {callee = @f, slice = @one_by_one, in_shardings = [[["d"], ["m"]]], out_shardings = [[["d"], ["m"]]], label = "f#1"} : (tensor<8x4xf32>) -> tensor<8x4xf32>
  %2 = "pw.compute"(%1) {callee = @f, slice = @mesh, in_shardings = [[["c"], ["r"]]], out_shardings = [[["c"], ["r"]]], label = "f#2"} : (tensor<8x4xf32>) -> tensor<8x4xf32>
  %3 = "pw.compute"(%2) {callee = @f, slice = @mesh, in_shardings = [[["r"], ["c"]]], out_shardings = [[["r"], ["c"]]], label = "f#3"} : (tensor<8x4xf32>) -> tensor<8x4xf32>
  return %3 : tensor<8x4xf32>
}
}
