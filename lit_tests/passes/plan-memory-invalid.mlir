// RUN: pw-opt %s --split-input-file --verify-diagnostics --pw-plan-memory

// Each case is a module pw-plan-memory cannot plan.

// Plans come from a lowered module.
// expected-error@below {{pw-plan-memory needs a lowered module with plans: run pw-emit-plans}}
module {
}

// -----

// Frees are planned once.
// expected-error@below {{pw-plan-memory has already run on this module}}
module attributes {pw.lowered} {
module @main_island0 attributes {pw.island_plan = {island = "island0", program = @main}} {
  "pw.free"() {after = array<i64>, buffers = array<i64>, step = 0 : i64, subgraph = 0 : i64} : () -> ()
}
}
