// RUN: pw-opt %s --split-input-file --pw-fuse-island | FileCheck %s
// RUN: pw-opt %s --split-input-file --pw-fuse-island=step_us=0 | FileCheck %s --check-prefix=NOPAY

// pw-fuse-island makes one launch, on the slice that covers them, of an
// island's computations on several slices and the ICI copies between them.
// With step_us=0 a saved step is worth nothing, so nothing pays:
// NOPAY-NOT: pw.fused

// The three-block program on one island: @b (2x2) covers @a and @c. The
// three computes and both copies become one compute of @island_f_0 on @b,
// whose calls constrain their operands to the originals' in_shardings (the
// copies) and whose label lists the computations. On @b's mesh, axis "d" of
// @a and of @c is "m" (at each of their devices the coordinate on "m" is
// theirs on "d"), so their shardings are written with "m". %x is used only
// inside, so the runtime puts it on @b directly (its pw.home); the result
// goes back to its home @c by a one-piece gather (its shards stay on their
// devices). scratch_bytes: the four values used only
// inside (f's and g's results and the two copies: 16 + 8 + 8 + 16 bytes).
// CHECK-LABEL: func.func @three_blocks
// CHECK-SAME: %arg0: tensor<8xf32> {pw.home = {sharding = {{\[\["m"\]\]}}, slice = @b}}
// CHECK-NEXT: %0 = "pw.compute"(%arg0) {callee = @island_f_0, in_shardings = {{\[\[\["m"\]\]\]}}, label = "f#0+g#0+h#0", out_shardings = {{\[\[\["m"\]\]\]}}, pw.subgraph = 0 : i64, slice = @b}
// CHECK-NEXT: %1 = "pw.gather"(%0) {dst = @c, dst_sharding = {{\[\["d"\]\]}}, link = "ici", piece_shape = array<i64: 4>, pieces = 1 : i64, pw.subgraph = 0 : i64, src = @b, src_sharding = {{\[\["m"\]\]}}}
// CHECK-NEXT: return %1
// CHECK: module @island_f_0 attributes {pw.executable, pw.fused = {calls = [{callee = @f, in_shardings = {{\[\[\["m"\]\]\]}}, operands = array<i64: 0>, results = 1 : i64}, {callee = @g, in_shardings = {{\[\[\["d", "m"\]\]\]}}, operands = array<i64: 1>, results = 1 : i64}, {callee = @h, in_shardings = {{\[\[\["m"\]\]\]}}, operands = array<i64: 2>, results = 1 : i64}], results = array<i64: 3>, scratch_bytes = 48 : i64}}
// CHECK-NEXT: func.func private @main(tensor<8xf32>) -> tensor<8xf32>
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [{device_kind = "cpu", device_memory_bytes = 1073741824, devices_per_host = 4, hosts = 1, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}, name = "island0"}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["d"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 2>}} : () -> ()
"pw.virtual_slice"() {sym_name = "b", shape = array<i64: 2, 2>, axes = ["d", "m"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 4>}} : () -> ()
"pw.virtual_slice"() {sym_name = "c", shape = array<i64: 2>, axes = ["d"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 2, 4>}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
module @g attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
module @h attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
func.func @three_blocks(%x: tensor<8xf32> {pw.home = {slice = @a, sharding = [["d"]]}}) -> tensor<8xf32> attributes {pw.program, pw.subgraphs = [{id = 0, static = true}]} {
  %0 = "pw.compute"(%x) {callee = @f, slice = @a, in_shardings = [[["d"]]], out_shardings = [[["d"]]], label = "f#0", pw.subgraph = 0} : (tensor<8xf32>) -> tensor<8xf32>
  %1 = "pw.scatter"(%0) {src = @a, dst = @b, src_sharding = [["d"]], dst_sharding = [["d", "m"]], pieces = 2, piece_shape = array<i64: 2>, link = "ici", pw.subgraph = 0} : (tensor<8xf32>) -> tensor<8xf32>
  %2 = "pw.compute"(%1) {callee = @g, slice = @b, in_shardings = [[["d", "m"]]], out_shardings = [[["d", "m"]]], label = "g#0", pw.subgraph = 0} : (tensor<8xf32>) -> tensor<8xf32>
  %3 = "pw.gather"(%2) {src = @b, dst = @c, src_sharding = [["d", "m"]], dst_sharding = [["d"]], pieces = 2, piece_shape = array<i64: 2>, link = "ici", pw.subgraph = 0} : (tensor<8xf32>) -> tensor<8xf32>
  %4 = "pw.compute"(%3) {callee = @h, slice = @c, in_shardings = [[["d"]]], out_shardings = [[["d"]]], label = "h#0", pw.subgraph = 0} : (tensor<8xf32>) -> tensor<8xf32>
  return %4 : tensor<8xf32>
}
}

// -----

// %x is returned as well, so it moves onto @b instead of being put there;
// f#0's result is returned too: the fused executable returns it on @b and a
// transfer takes it back to @a. Four steps become three, which pays (1 µs
// of ICI latency per added copy against step_us = 50).
// CHECK-LABEL: func.func @escapes
// CHECK-SAME: %arg0: tensor<8xf32> {pw.home = {sharding = {{\[\["d"\]\]}}, slice = @a}}
// CHECK-NEXT: %0 = "pw.gather"(%arg0) {dst = @b, dst_sharding = {{\[\["m"\]\]}}, link = "ici", {{.*}}pieces = 1 : i64, {{.*}}src = @a, src_sharding = {{\[\["d"\]\]}}}
// CHECK-NEXT: %1:2 = "pw.compute"(%0) {callee = @island_f_0, {{.*}}label = "f#0+f#1+f#2"
// CHECK-NEXT: %2 = "pw.gather"(%1#0) {dst = @a, {{.*}}src = @b, src_sharding = {{\[\["m"\]\]}}}
// CHECK-NEXT: return %1#1, %2, %arg0
// CHECK: pw.fused = {calls = [{callee = @f, {{.*}}}, {callee = @f, {{.*}}}, {callee = @f, {{.*}}}], results = array<i64: 1, 3>, scratch_bytes = 16 : i64}
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [{device_kind = "cpu", device_memory_bytes = 1073741824, devices_per_host = 4, hosts = 1, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}, name = "island0"}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["d"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 2>}} : () -> ()
"pw.virtual_slice"() {sym_name = "b", shape = array<i64: 2, 2>, axes = ["d", "m"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 4>}} : () -> ()
"pw.virtual_slice"() {sym_name = "c", shape = array<i64: 2>, axes = ["d"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 2, 4>}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
func.func @escapes(%x: tensor<8xf32> {pw.home = {slice = @a, sharding = [["d"]]}}) -> (tensor<8xf32>, tensor<8xf32>, tensor<8xf32>) attributes {pw.program, pw.subgraphs = [{id = 0, static = true}]} {
  %0 = "pw.compute"(%x) {callee = @f, slice = @a, in_shardings = [[["d"]]], out_shardings = [[["d"]]], label = "f#0", pw.subgraph = 0} : (tensor<8xf32>) -> tensor<8xf32>
  %1 = "pw.scatter"(%0) {src = @a, dst = @b, src_sharding = [["d"]], dst_sharding = [["d", "m"]], pieces = 2, piece_shape = array<i64: 2>, link = "ici", pw.subgraph = 0} : (tensor<8xf32>) -> tensor<8xf32>
  %2 = "pw.compute"(%1) {callee = @f, slice = @b, in_shardings = [[["d", "m"]]], out_shardings = [[["d", "m"]]], label = "f#1", pw.subgraph = 0} : (tensor<8xf32>) -> tensor<8xf32>
  %3 = "pw.compute"(%2) {callee = @f, slice = @b, in_shardings = [[["d", "m"]]], out_shardings = [[["d", "m"]]], label = "f#2", pw.subgraph = 0} : (tensor<8xf32>) -> tensor<8xf32>
  return %3, %0, %x : tensor<8xf32>, tensor<8xf32>, tensor<8xf32>
}
}

// -----

// Left alone: @a and @c, neither of which covers the other (no cover
// slice); and computations after a data-dependent decision (not static).
// CHECK-LABEL: func.func @no_cover
// CHECK-NEXT: "pw.compute"(%arg0) {callee = @f,
// CHECK-NEXT: "pw.transfer"
// CHECK-NEXT: "pw.compute"({{.*}}) {callee = @f,
// CHECK-LABEL: func.func @not_static
// CHECK-NEXT: "pw.compute"(%arg0) {callee = @f,
// CHECK-NEXT: "pw.scatter"
// CHECK-NEXT: "pw.compute"({{.*}}) {callee = @f,
// CHECK-NOT: pw.fused
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [{device_kind = "cpu", device_memory_bytes = 1073741824, devices_per_host = 4, hosts = 1, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}, name = "island0"}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["d"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 2>}} : () -> ()
"pw.virtual_slice"() {sym_name = "b", shape = array<i64: 2, 2>, axes = ["d", "m"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 4>}} : () -> ()
"pw.virtual_slice"() {sym_name = "c", shape = array<i64: 2>, axes = ["d"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 2, 4>}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
func.func @no_cover(%x: tensor<8xf32> {pw.home = {slice = @a, sharding = [["d"]]}}) -> tensor<8xf32> attributes {pw.program, pw.subgraphs = [{id = 0, static = true}]} {
  %0 = "pw.compute"(%x) {callee = @f, slice = @a, in_shardings = [[["d"]]], out_shardings = [[["d"]]], label = "f#0", pw.subgraph = 0} : (tensor<8xf32>) -> tensor<8xf32>
  %1 = "pw.transfer"(%0) {src = @a, dst = @c, sharding = [["d"]], link = "ici", pw.subgraph = 0} : (tensor<8xf32>) -> tensor<8xf32>
  %2 = "pw.compute"(%1) {callee = @f, slice = @c, in_shardings = [[["d"]]], out_shardings = [[["d"]]], label = "f#1", pw.subgraph = 0} : (tensor<8xf32>) -> tensor<8xf32>
  return %2 : tensor<8xf32>
}
func.func @not_static(%x: tensor<8xf32> {pw.home = {slice = @a, sharding = [["d"]]}}) -> tensor<8xf32> attributes {pw.program, pw.subgraphs = [{id = 0, static = true}, {id = 1, static = false}]} {
  %0 = "pw.compute"(%x) {callee = @f, slice = @a, in_shardings = [[["d"]]], out_shardings = [[["d"]]], label = "f#0", pw.subgraph = 1} : (tensor<8xf32>) -> tensor<8xf32>
  %1 = "pw.scatter"(%0) {src = @a, dst = @b, src_sharding = [["d"]], dst_sharding = [["d", "m"]], pieces = 2, piece_shape = array<i64: 2>, link = "ici", pw.subgraph = 1} : (tensor<8xf32>) -> tensor<8xf32>
  %2 = "pw.compute"(%1) {callee = @f, slice = @b, in_shardings = [[["d", "m"]]], out_shardings = [[["d", "m"]]], label = "f#1", pw.subgraph = 1} : (tensor<8xf32>) -> tensor<8xf32>
  return %2 : tensor<8xf32>
}
}

// -----

// Left alone: another program of the module uses @c, on devices the cover
// @b holds (a fused launch would keep them from it).
// CHECK-LABEL: func.func @shared
// CHECK-NEXT: "pw.compute"(%arg0) {callee = @f,
// CHECK-NEXT: "pw.scatter"
// CHECK-NEXT: "pw.compute"({{.*}}) {callee = @f,
// CHECK-LABEL: func.func @other
// CHECK-NOT: pw.fused
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [{device_kind = "cpu", device_memory_bytes = 1073741824, devices_per_host = 4, hosts = 1, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}, name = "island0"}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["d"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 2>}} : () -> ()
"pw.virtual_slice"() {sym_name = "b", shape = array<i64: 2, 2>, axes = ["d", "m"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 4>}} : () -> ()
"pw.virtual_slice"() {sym_name = "c", shape = array<i64: 2>, axes = ["d"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 2, 4>}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
func.func @shared(%x: tensor<8xf32> {pw.home = {slice = @a, sharding = [["d"]]}}) -> tensor<8xf32> attributes {pw.program, pw.subgraphs = [{id = 0, static = true}]} {
  %0 = "pw.compute"(%x) {callee = @f, slice = @a, in_shardings = [[["d"]]], out_shardings = [[["d"]]], label = "f#0", pw.subgraph = 0} : (tensor<8xf32>) -> tensor<8xf32>
  %1 = "pw.scatter"(%0) {src = @a, dst = @b, src_sharding = [["d"]], dst_sharding = [["d", "m"]], pieces = 2, piece_shape = array<i64: 2>, link = "ici", pw.subgraph = 0} : (tensor<8xf32>) -> tensor<8xf32>
  %2 = "pw.compute"(%1) {callee = @f, slice = @b, in_shardings = [[["d", "m"]]], out_shardings = [[["d", "m"]]], label = "f#1", pw.subgraph = 0} : (tensor<8xf32>) -> tensor<8xf32>
  return %2 : tensor<8xf32>
}
func.func @other(%x: tensor<8xf32> {pw.home = {slice = @c, sharding = [["d"]]}}) -> tensor<8xf32> attributes {pw.program, pw.subgraphs = [{id = 0, static = true}]} {
  %0 = "pw.compute"(%x) {callee = @f, slice = @c, in_shardings = [[["d"]]], out_shardings = [[["d"]]], label = "f#0", pw.subgraph = 0} : (tensor<8xf32>) -> tensor<8xf32>
  return %0 : tensor<8xf32>
}
}

// -----

// Left alone: slice @e has devices 1 and 0 in this order, so no axis of the
// cover @b has its coordinates there: on @b, its shards would have to move.
// CHECK-LABEL: func.func @no_renaming
// CHECK-NEXT: "pw.compute"(%arg0) {callee = @f,
// CHECK-NEXT: "pw.scatter"
// CHECK-NEXT: "pw.compute"({{.*}}) {callee = @f,
// CHECK-NOT: pw.fused
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [{device_kind = "cpu", device_memory_bytes = 1073741824, devices_per_host = 4, hosts = 1, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}, name = "island0"}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["d"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 2>}} : () -> ()
"pw.virtual_slice"() {sym_name = "b", shape = array<i64: 2, 2>, axes = ["d", "m"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 4>}} : () -> ()
"pw.virtual_slice"() {sym_name = "c", shape = array<i64: 2>, axes = ["d"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 2, 4>}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
"pw.virtual_slice"() {sym_name = "e", shape = array<i64: 2>, axes = ["x"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 1, 2, 0, 1>}} : () -> ()
func.func @no_renaming(%x: tensor<8xf32> {pw.home = {slice = @e, sharding = [["x"]]}}) -> tensor<8xf32> attributes {pw.program, pw.subgraphs = [{id = 0, static = true}]} {
  %0 = "pw.compute"(%x) {callee = @f, slice = @e, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "f#0", pw.subgraph = 0} : (tensor<8xf32>) -> tensor<8xf32>
  %1 = "pw.scatter"(%0) {src = @e, dst = @b, src_sharding = [["x"]], dst_sharding = [["d", "m"]], pieces = 2, piece_shape = array<i64: 2>, link = "ici", pw.subgraph = 0} : (tensor<8xf32>) -> tensor<8xf32>
  %2 = "pw.compute"(%1) {callee = @f, slice = @b, in_shardings = [[["d", "m"]]], out_shardings = [[["d", "m"]]], label = "f#1", pw.subgraph = 0} : (tensor<8xf32>) -> tensor<8xf32>
  return %2 : tensor<8xf32>
}
}

// -----

// @f's code names its slice's axis (its module declares a Shardy mesh, as
// jax.shard_map or a sharding constraint by PartitionSpec lowers): it runs
// only on @a's mesh, so it ends the run, and only g#0 and h#0 are fused.
// CHECK-LABEL: func.func @named_axes
// CHECK-NEXT: %0 = "pw.compute"(%arg0) {callee = @f, {{.*}}label = "f#0"
// CHECK-NEXT: %1 = "pw.scatter"(%0)
// CHECK-NEXT: %2 = "pw.compute"(%1) {callee = @island_g_0, {{.*}}label = "g#0+h#0"
module attributes {pw.topology = {dcn = {bandwidth_gbps = 25.0, latency_us = 100.0}, islands = [{device_kind = "cpu", device_memory_bytes = 1073741824, devices_per_host = 4, hosts = 1, ici = {bandwidth_gbps = 100.0, latency_us = 1.0}, name = "island0"}]}} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["d"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 2>}} : () -> ()
"pw.virtual_slice"() {sym_name = "b", shape = array<i64: 2, 2>, axes = ["d", "m"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 0, 4>}} : () -> ()
"pw.virtual_slice"() {sym_name = "c", shape = array<i64: 2>, axes = ["d"], constraints = {}, pw.placement = {island = "island0", devices = array<i64: 2, 4>}} : () -> ()
module @f attributes {pw.executable} {
  "sdy.mesh"() {sym_name = "mesh", mesh = #sdy.mesh<["d"=2]>} : () -> ()
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
module @g attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
module @h attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
func.func @named_axes(%x: tensor<8xf32> {pw.home = {slice = @a, sharding = [["d"]]}}) -> tensor<8xf32> attributes {pw.program, pw.subgraphs = [{id = 0, static = true}]} {
  %0 = "pw.compute"(%x) {callee = @f, slice = @a, in_shardings = [[["d"]]], out_shardings = [[["d"]]], label = "f#0", pw.subgraph = 0} : (tensor<8xf32>) -> tensor<8xf32>
  %1 = "pw.scatter"(%0) {src = @a, dst = @b, src_sharding = [["d"]], dst_sharding = [["d", "m"]], pieces = 2, piece_shape = array<i64: 2>, link = "ici", pw.subgraph = 0} : (tensor<8xf32>) -> tensor<8xf32>
  %2 = "pw.compute"(%1) {callee = @g, slice = @b, in_shardings = [[["d", "m"]]], out_shardings = [[["d", "m"]]], label = "g#0", pw.subgraph = 0} : (tensor<8xf32>) -> tensor<8xf32>
  %3 = "pw.gather"(%2) {src = @b, dst = @c, src_sharding = [["d", "m"]], dst_sharding = [["d"]], pieces = 2, piece_shape = array<i64: 2>, link = "ici", pw.subgraph = 0} : (tensor<8xf32>) -> tensor<8xf32>
  %4 = "pw.compute"(%3) {callee = @h, slice = @c, in_shardings = [[["d"]]], out_shardings = [[["d"]]], label = "h#0", pw.subgraph = 0} : (tensor<8xf32>) -> tensor<8xf32>
  return %4 : tensor<8xf32>
}
}
