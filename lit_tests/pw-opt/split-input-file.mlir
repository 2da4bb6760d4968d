// RUN: pw-opt %s --split-input-file | FileCheck %s
// RUN: pw-opt %s --split-input-file --pw-verify --mlir-print-ir-after-all 2>&1 >/dev/null | FileCheck %s --check-prefix=AFTER
// RUN: pw-opt --list-passes | FileCheck %s --check-prefix=LIST
// RUN: pw-opt --pass-help=pw-verify | FileCheck %s --check-prefix=HELP
// RUN: cat %s | pw-opt - -o %t && FileCheck %s --check-prefix=STDIN < %t

// Each chunk is parsed and printed on its own, separated by "// -----".

// CHECK-LABEL: module
// CHECK: sym_name = "a"
// CHECK: // -----
// CHECK: sym_name = "b"
// AFTER-COUNT-2: IR Dump After pw-verify
// LIST: Passes:
// LIST: pw-verify - Check the semantic rules
// HELP: pw-verify: Check the semantic rules
// HELP: Requires nothing; changes nothing.
// STDIN: sym_name = "a"
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()

// -----

"pw.virtual_slice"() {sym_name = "b", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()
