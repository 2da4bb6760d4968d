// RUN: not pw-opt %s --split-input-file --verify-diagnostics --pw-verify 2>&1 | FileCheck %s

// The diagnostic verifier fails when an expected diagnostic is missing or an
// unexpected one appears.

// An expectation that no diagnostic meets.
// CHECK: verify-diagnostics.mlir:[[@LINE+1]]:4: error: expected error "this never happens" was not produced
// expected-error@below {{this never happens}}
"pw.virtual_slice"() {sym_name = "v0", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()

// -----

// A diagnostic that nothing expects.
// CHECK: verify-diagnostics.mlir:[[@LINE+1]]:1: error: unexpected error: 'pw.virtual_slice' op slice @v0 repeats an axis name
"pw.virtual_slice"() {sym_name = "v0", shape = array<i64: 2, 2>, axes = ["x", "x"], constraints = {}} : () -> ()

// -----

// A diagnostic located in another file meets no expectation, although its line number is this line's.
// CHECK: model.py:[[@LINE+3]]:1: error: unexpected error: 'pw.virtual_slice' op slice @v0 has 2 mesh dimensions
// CHECK: verify-diagnostics.mlir:[[@LINE+1]]:4: error: expected error "has 2 mesh dimensions" was not produced
// expected-error@below {{has 2 mesh dimensions}}
"pw.virtual_slice"() {sym_name = "v0", shape = array<i64: 2, 2>, axes = ["x"], constraints = {}} : () -> () loc("model.py":23:1)

// -----

// A met expectation reports nothing.
// CHECK-NOT: axis names
// expected-error@+1 {{has 2 mesh dimensions but 1 axis names}}
"pw.virtual_slice"() {sym_name = "v0", shape = array<i64: 2, 2>, axes = ["x"], constraints = {}} : () -> ()
