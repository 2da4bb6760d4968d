// RUN: pw-opt %s --pw-place='topology=2x4 pin=a=island1:2,c=island1' | FileCheck %s

// Pins force a slice onto an island (and optionally its first device); the
// other slices are placed around them. The topology comes from the option.

// CHECK-LABEL: module attributes {pw.topology = {{{.*}}name = "island0"{{.*}}name = "island1"
// CHECK: pw.placement = {devices = array<i64: 2, 4>, island = "island1"}, {{.*}}sym_name = "a"
// CHECK: pw.placement = {devices = array<i64: 0, 2>, island = "island0"}, {{.*}}sym_name = "b"
// CHECK: pw.placement = {devices = array<i64: 0, 2>, island = "island1"}, {{.*}}sym_name = "c"
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()
"pw.virtual_slice"() {sym_name = "b", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()
"pw.virtual_slice"() {sym_name = "c", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()
