// RUN: pw-opt %s --verify-diagnostics --pw-alias-slices

// pw-alias-slices moves computations between slices before any data movement
// names them: a lowered module is refused.
// expected-error@below {{pw-alias-slices runs before pw-insert-transfers, on a module not yet lowered}}
module attributes {pw.lowered} {
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()
}
