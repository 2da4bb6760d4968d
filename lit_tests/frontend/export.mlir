// RUN: pw-export %S/../../examples/three_blocks.py:three_blocks --arg 'f32[8,16]' | pw-opt --pw-verify | FileCheck %s
// RUN: pw-export %S/Inputs/route.py:route --arg 'f32[8,16]' | pw-opt --pw-verify | FileCheck %s --check-prefix=COND
// RUN: not pw-export %S/Inputs/route.py:route --arg 'f32[8,6]' 2>&1 | FileCheck %s --check-prefix=ERR

// pw-export traces a Python program into pw IR that pw-opt reads and verifies.

// The blog's three blocks: one slice, one compiled function, one pw.compute each.
// CHECK: "pw.virtual_slice"() {axes = ["data"], constraints = {}, shape = array<i64: 2>, sym_name = "slice_a"}
// CHECK: "pw.virtual_slice"() {axes = ["data", "model"], constraints = {}, shape = array<i64: 2, 2>, sym_name = "slice_b"}
// CHECK: "pw.virtual_slice"() {axes = ["data"], constraints = {}, shape = array<i64: 2>, sym_name = "slice_c"}
// CHECK: module @block_a attributes {{{.*}}pw.executable, pw.export = "{{[A-Za-z0-9+/=]+}}"}
// CHECK: func.func public @main(%{{.*}}: tensor<8x16xf32>) -> (tensor<8x16xf32>
// CHECK: "stablehlo.tanh"
// CHECK: module @block_b
// CHECK: module @block_c
// CHECK-LABEL: func.func @three_blocks(%arg0: tensor<8x16xf32>) -> tensor<8x16xf32> attributes {pw.program}
// CHECK-NEXT: %[[A:.*]] = "pw.compute"(%arg0) {callee = @block_a, in_shardings = {{\[\[\["data"\], \[\]\]\]}}, label = "block_a#0", out_shardings = {{\[\[\["data"\], \[\]\]\]}}, slice = @slice_a}
// CHECK-NEXT: %[[B:.*]] = "pw.compute"(%[[A]]) {callee = @block_b, in_shardings = {{\[\[\["data"\], \["model"\]\]\]}}, label = "block_b#0", {{.*}}, slice = @slice_b}
// CHECK-NEXT: %[[C:.*]] = "pw.compute"(%[[B]]) {callee = @block_c, {{.*}}label = "block_c#0", {{.*}}slice = @slice_c}
// CHECK-NEXT: return %[[C]]

// A data-dependent step: the predicate comes from a computation; each branch is a program.
// COND: "pw.virtual_slice"() {axes = ["data"], constraints = {}, shape = array<i64: 2>, sym_name = "small"}
// COND: "pw.virtual_slice"() {axes = ["data", "model"], constraints = {device_kind = "cpu"}, shape = array<i64: 2, 4>, sym_name = "large"}
// COND-LABEL: func.func @route(%arg0: tensor<8x16xf32>) -> tensor<8x16xf32> attributes {pw.program}
// COND-NEXT: %[[P:.*]] = "pw.compute"(%arg0) {callee = @is_positive, in_shardings = {{\[\[\["data"\], \[\]\]\]}}, label = "is_positive#0", out_shardings = {{\[\[\]\]}}, slice = @small} : (tensor<8x16xf32>) -> tensor<i1>
// COND-NEXT: %[[R:.*]] = "pw.cond"(%[[P]], %arg0) {else_program = @cheap, label = "cond#0", then_program = @expensive} : (tensor<i1>, tensor<8x16xf32>) -> tensor<8x16xf32>
// COND-NEXT: "pw.compute"(%[[R]]) {callee = @cheap_1, {{.*}}label = "cheap#1", {{.*}}slice = @small}
// COND-LABEL: func.func @expensive(%arg0: tensor<8x16xf32>) -> tensor<8x16xf32> attributes {pw.program}
// COND-NEXT: "pw.compute"(%arg0) {callee = @expensive_1, {{.*}}label = "expensive#0", {{.*}}slice = @large}
// COND-LABEL: func.func @cheap(%arg0: tensor<8x16xf32>) -> tensor<8x16xf32> attributes {pw.program}
// COND-NEXT: "pw.compute"(%arg0) {callee = @cheap_1, {{.*}}label = "cheap#0", {{.*}}slice = @small}

// A bad placement is one line naming the Python call.
// ERR: pw-export: error: PlacementError: expensive at {{.*}}route.py:28: input[0] f32[8,6] with spec P('data', 'model') on slice @large: dimension 1 of size 6 is split 4 ways
