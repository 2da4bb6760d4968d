// RUN: pw-opt %s --split-input-file --pass-pipeline='builtin.module(pw-lower{topology=2x4 strategy=spread})' | FileCheck %s
// RUN: pw-opt %s --split-input-file --verify-each=false --pass-pipeline='builtin.module(pw-lower{topology=2x4 strategy=spread})' | FileCheck %s

// pw-lower turns device-agnostic programs into verified per-island plans.
// strategy=spread, so that the plans cross islands (DCN sends and receives);
// place-auto.mlir lowers with the default strategy=auto. Without the checks
// between passes (--verify-each=false, as lower() runs) the output is the same.

// The blog's three-block program on two islands of four devices: A and C
// share island0, B (2x2) takes island1; A -> B scatters 2-way into 4-way over
// DCN, B -> C gathers back. Each buffer is freed after its last use; each
// island's plan records its static peak (island0: the argument and A's result
// on slice_a's devices, C's input and result on slice_c's).
// CHECK-LABEL: module @three_blocks_island0 attributes {pw.island_plan = {island = "island0", program = @three_blocks}, pw.peak_bytes = array<i64: 0, 4, 512>}
// CHECK: "pw.launch"() {after = array<i64>, devices = array<i64: 0, 2>, executable = @block_a, inputs = array<i64: 0>, label = "block_a#0", output_bytes = array<i64: 256>, outputs = array<i64: 1>, slice = @slice_a, step = 0 : i64, subgraph = 0 : i64}
// CHECK-NEXT: "pw.free"() {after = array<i64: 0>, buffers = array<i64: 0>, step = 7 : i64, subgraph = 0 : i64}
// CHECK-NEXT: "pw.send"() {after = array<i64: 0>, buffer = 1 : i64, bytes = 128 : i64, devices = array<i64: 0, 2>, link = "dcn", peer = "island1", peer_buffer = 2 : i64, step = 1 : i64, subgraph = 0 : i64}
// CHECK-NEXT: "pw.free"() {after = array<i64: 1>, buffers = array<i64: 1>, step = 8 : i64, subgraph = 0 : i64}
// CHECK-NEXT: "pw.recv"() {after = array<i64: 4>, buffer = 4 : i64, bytes = 256 : i64, devices = array<i64: 2, 4>, link = "dcn", peer = "island1", peer_buffer = 3 : i64, step = 5 : i64, subgraph = 0 : i64}
// CHECK-NEXT: "pw.launch"() {after = array<i64: 5>, devices = array<i64: 2, 4>, executable = @block_c, inputs = array<i64: 4>, label = "block_c#0", output_bytes = array<i64: 256>, outputs = array<i64: 5>, slice = @slice_c, step = 6 : i64, subgraph = 0 : i64}
// CHECK-NEXT: "pw.free"() {after = array<i64: 6>, buffers = array<i64: 4>, step = 9 : i64, subgraph = 0 : i64}
// CHECK-LABEL: module @three_blocks_island1 attributes {pw.island_plan = {island = "island1", program = @three_blocks}, pw.peak_bytes = array<i64: 0, 4, 256>}
// CHECK: "pw.recv"() {after = array<i64: 1>, buffer = 2 : i64, bytes = 128 : i64, devices = array<i64: 0, 4>, link = "dcn", peer = "island0", peer_buffer = 1 : i64, step = 2 : i64, subgraph = 0 : i64}
// CHECK-NEXT: "pw.launch"() {after = array<i64: 2>, devices = array<i64: 0, 4>, executable = @block_b, inputs = array<i64: 2>, label = "block_b#0", output_bytes = array<i64: 128>, outputs = array<i64: 3>, slice = @slice_b, step = 3 : i64, subgraph = 0 : i64}
// CHECK-NEXT: "pw.free"() {after = array<i64: 3>, buffers = array<i64: 2>, step = 10 : i64, subgraph = 0 : i64}
// CHECK-NEXT: "pw.send"() {after = array<i64: 3>, buffer = 3 : i64, bytes = 256 : i64, devices = array<i64: 0, 4>, link = "dcn", peer = "island0", peer_buffer = 4 : i64, step = 4 : i64, subgraph = 0 : i64}
// CHECK-LABEL: module @three_blocks_host attributes {pw.host_plan = {inputs = array<i64: 0>, outputs = array<i64: 5>, program = @three_blocks, subgraphs = [{id = 0 : i64, static = true}]}}
"pw.virtual_slice"() {sym_name = "slice_a", shape = array<i64: 2>, axes = ["data"], constraints = {}} : () -> ()
"pw.virtual_slice"() {sym_name = "slice_b", shape = array<i64: 2, 2>, axes = ["data", "model"], constraints = {}} : () -> ()
"pw.virtual_slice"() {sym_name = "slice_c", shape = array<i64: 2>, axes = ["data"], constraints = {}} : () -> ()
module @block_a attributes {pw.executable} {
  func.func public @main(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
    %0 = "stablehlo.tanh"(%x) : (tensor<8x16xf32>) -> tensor<8x16xf32>
    return %0 : tensor<8x16xf32>
  }
}
module @block_b attributes {pw.executable} {
  func.func public @main(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
    %0 = "stablehlo.multiply"(%x, %x) : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8x16xf32>
    return %0 : tensor<8x16xf32>
  }
}
module @block_c attributes {pw.executable} {
  func.func public @main(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
    %0 = "stablehlo.negate"(%x) : (tensor<8x16xf32>) -> tensor<8x16xf32>
    return %0 : tensor<8x16xf32>
  }
}
func.func @three_blocks(%x: tensor<8x16xf32>) -> tensor<8x16xf32> attributes {pw.program} {
  %a = "pw.compute"(%x) {callee = @block_a, slice = @slice_a, in_shardings = [[["data"], []]], out_shardings = [[["data"], []]], label = "block_a#0"} : (tensor<8x16xf32>) -> tensor<8x16xf32>
  %b = "pw.compute"(%a) {callee = @block_b, slice = @slice_b, in_shardings = [[["data"], ["model"]]], out_shardings = [[["data"], ["model"]]], label = "block_b#0"} : (tensor<8x16xf32>) -> tensor<8x16xf32>
  %c = "pw.compute"(%b) {callee = @block_c, slice = @slice_c, in_shardings = [[["data"], []]], out_shardings = [[["data"], []]], label = "block_c#0"} : (tensor<8x16xf32>) -> tensor<8x16xf32>
  return %c : tensor<8x16xf32>
}

// -----

// A 4-stage pipeline across 2 islands: stages 0-1 on island0, 2-3 on island1
// (by constraint); stage to stage is an ICI copy inside an island and a
// send/recv pair across.
// CHECK-LABEL: module @pipeline_island0
// CHECK: "pw.launch"() {{.*}}label = "stage0#0"{{.*}}slice = @stage0, step = 0
// CHECK: "pw.copy"() {after = array<i64: 0>, bytes = 1024 : i64, dst_buffer = 2 : i64, link = "ici", src_buffer = 1 : i64, step = 1
// CHECK: "pw.launch"() {after = array<i64: 1>, {{.*}}label = "stage1#0"{{.*}}slice = @stage1, step = 2
// CHECK: "pw.send"() {after = array<i64: 2>, buffer = 3 : i64, bytes = 1024 : i64, devices = array<i64: 2, 4>, link = "dcn", peer = "island1", peer_buffer = 4 : i64, step = 3
// CHECK-LABEL: module @pipeline_island1
// CHECK: "pw.recv"() {after = array<i64: 3>, buffer = 4 : i64, bytes = 1024 : i64, devices = array<i64: 0, 2>, link = "dcn", peer = "island0", peer_buffer = 3 : i64, step = 4
// CHECK-NEXT: "pw.launch"() {after = array<i64: 4>, {{.*}}label = "stage2#0"{{.*}}slice = @stage2, step = 5
// CHECK: "pw.copy"() {after = array<i64: 5>, bytes = 1024 : i64, dst_buffer = 6 : i64, link = "ici", src_buffer = 5 : i64, step = 6
// CHECK: "pw.launch"() {after = array<i64: 6>, {{.*}}label = "stage3#0"{{.*}}slice = @stage3, step = 7
// CHECK-LABEL: module @pipeline_host attributes {pw.host_plan = {inputs = array<i64: 0>, outputs = array<i64: 7>
"pw.virtual_slice"() {sym_name = "stage0", shape = array<i64: 2>, axes = ["x"], constraints = {island = "island0"}} : () -> ()
"pw.virtual_slice"() {sym_name = "stage1", shape = array<i64: 2>, axes = ["x"], constraints = {island = "island0"}} : () -> ()
"pw.virtual_slice"() {sym_name = "stage2", shape = array<i64: 2>, axes = ["x"], constraints = {island = "island1"}} : () -> ()
"pw.virtual_slice"() {sym_name = "stage3", shape = array<i64: 2>, axes = ["x"], constraints = {island = "island1"}} : () -> ()
module @layer attributes {pw.executable} {
  func.func public @main(%x: tensor<16x32xf32>) -> tensor<16x32xf32> {
    %0 = "stablehlo.tanh"(%x) : (tensor<16x32xf32>) -> tensor<16x32xf32>
    return %0 : tensor<16x32xf32>
  }
}
func.func @pipeline(%x: tensor<16x32xf32>) -> tensor<16x32xf32> attributes {pw.program} {
  %0 = "pw.compute"(%x) {callee = @layer, slice = @stage0, in_shardings = [[["x"], []]], out_shardings = [[["x"], []]], label = "stage0#0"} : (tensor<16x32xf32>) -> tensor<16x32xf32>
  %1 = "pw.compute"(%0) {callee = @layer, slice = @stage1, in_shardings = [[["x"], []]], out_shardings = [[["x"], []]], label = "stage1#0"} : (tensor<16x32xf32>) -> tensor<16x32xf32>
  %2 = "pw.compute"(%1) {callee = @layer, slice = @stage2, in_shardings = [[["x"], []]], out_shardings = [[["x"], []]], label = "stage2#0"} : (tensor<16x32xf32>) -> tensor<16x32xf32>
  %3 = "pw.compute"(%2) {callee = @layer, slice = @stage3, in_shardings = [[["x"], []]], out_shardings = [[["x"], []]], label = "stage3#0"} : (tensor<16x32xf32>) -> tensor<16x32xf32>
  return %3 : tensor<16x32xf32>
}

// -----

// Two programs sharing island0: one order over both, so island0 runs "train"
// before "eval" on every device they share.
// CHECK-LABEL: module @train_island0
// CHECK: label = "train#0"{{.*}}step = 0
// CHECK: "pw.copy"() {{.*}}step = 1
// CHECK: label = "train#1"{{.*}}step = 2
// CHECK-LABEL: module @eval_island0
// CHECK: label = "eval#0"{{.*}}step = 3
// CHECK: "pw.copy"() {{.*}}step = 4
// CHECK: label = "eval#1"{{.*}}step = 5
"pw.virtual_slice"() {sym_name = "big", shape = array<i64: 4>, axes = ["x"], constraints = {island = "island0"}} : () -> ()
"pw.virtual_slice"() {sym_name = "small", shape = array<i64: 2>, axes = ["x"], constraints = {island = "island0"}} : () -> ()
module @step attributes {pw.executable} {
  func.func public @main(%x: tensor<8xf32>) -> tensor<8xf32> {
    %0 = "stablehlo.add"(%x, %x) : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
    return %0 : tensor<8xf32>
  }
}
func.func @train(%x: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program} {
  %0 = "pw.compute"(%x) {callee = @step, slice = @big, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "train#0"} : (tensor<8xf32>) -> tensor<8xf32>
  %1 = "pw.compute"(%0) {callee = @step, slice = @small, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "train#1"} : (tensor<8xf32>) -> tensor<8xf32>
  return %1 : tensor<8xf32>
}
func.func @eval(%x: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program} {
  %0 = "pw.compute"(%x) {callee = @step, slice = @small, in_shardings = [[[]]], out_shardings = [[[]]], label = "eval#0"} : (tensor<8xf32>) -> tensor<8xf32>
  %1 = "pw.compute"(%0) {callee = @step, slice = @big, in_shardings = [[[]]], out_shardings = [[[]]], label = "eval#1"} : (tensor<8xf32>) -> tensor<8xf32>
  return %1 : tensor<8xf32>
}

// -----

// A data-dependent branch: the host reads the predicate and runs a branch
// program's plan; what uses the branch's result is a second, non-static
// subgraph, dispatched after the decision.
// CHECK-LABEL: func.func @main
// CHECK-SAME: pw.subgraphs = [{id = 0 : i64, static = true}, {id = 1 : i64, static = false}]
// CHECK-LABEL: module @negate_island0
// CHECK: label = "negate#0"
// CHECK-LABEL: module @keep_host attributes {pw.host_plan = {inputs = array<i64: 0>, outputs = array<i64: 0>, program = @keep, subgraphs = []}}
// CHECK-LABEL: module @main_island0
// CHECK: label = "positive#0"{{.*}}outputs = array<i64: 1>{{.*}}step = 1 : i64, subgraph = 0 : i64
// CHECK: "pw.launch"() {after = array<i64: 2>, {{.*}}label = "after#0"{{.*}}step = 3 : i64, subgraph = 1 : i64
// CHECK-LABEL: module @main_host
// CHECK: "pw.branch"() {after = array<i64: 1>, else_program = @keep, inputs = array<i64: 0>, label = "choose#0", outputs = array<i64: 2>, pred = 1 : i64, step = 2 : i64, subgraph = 0 : i64, then_program = @negate}
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()
module @f attributes {pw.executable} {
  func.func public @main(%x: tensor<8xf32>) -> tensor<8xf32> {
    %0 = "stablehlo.negate"(%x) : (tensor<8xf32>) -> tensor<8xf32>
    return %0 : tensor<8xf32>
  }
}
module @positive attributes {pw.executable} {
  func.func public @main(%x: tensor<8xf32>) -> tensor<i1> {
    %0 = "stablehlo.constant"() {value = dense<true> : tensor<i1>} : () -> tensor<i1>
    return %0 : tensor<i1>
  }
}
func.func @negate(%x: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program} {
  %0 = "pw.compute"(%x) {callee = @f, slice = @a, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "negate#0"} : (tensor<8xf32>) -> tensor<8xf32>
  return %0 : tensor<8xf32>
}
func.func @keep(%x: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program} {
  return %x : tensor<8xf32>
}
func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program} {
  %p = "pw.compute"(%x) {callee = @positive, slice = @a, in_shardings = [[["x"]]], out_shardings = [[]], label = "positive#0"} : (tensor<8xf32>) -> tensor<i1>
  %y = "pw.cond"(%p, %x) {then_program = @negate, else_program = @keep, label = "choose#0"} : (tensor<i1>, tensor<8xf32>) -> tensor<8xf32>
  %z = "pw.compute"(%y) {callee = @f, slice = @a, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "after#0"} : (tensor<8xf32>) -> tensor<8xf32>
  return %z : tensor<8xf32>
}
