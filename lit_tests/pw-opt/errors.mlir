// RUN: not pw-opt %s 2>&1 | FileCheck %s --check-prefix=PARSE
// RUN: not pw-opt %s --pass-pipeline='builtin.module(pw-nope)' 2>&1 | FileCheck %s --check-prefix=PIPELINE
// RUN: not pw-opt %s --pass-pipeline='builtin.module(pw-verify{bogus=1})' 2>&1 | FileCheck %s --check-prefix=OPTION
// RUN: not pw-opt %s --pass-pipeline='builtin.module(pw-fuse-island{step_us=nan})' 2>&1 | FileCheck %s --check-prefix=NAN
// RUN: not pw-opt %s --pass-pipeline='builtin.module(pw-place{pin=a=island0,a=island1})' 2>&1 | FileCheck %s --check-prefix=PIN
// RUN: not pw-opt %s --pass-pipeline='builtin.module(pw-verify pw-verify)' 2>&1 | FileCheck %s --check-prefix=COMMA
// RUN: not pw-opt %s --pass-pipeline='builtin.module(pw-place{strategy=pack strategy=spread})' 2>&1 | FileCheck %s --check-prefix=TWICE
// RUN: not pw-opt %s --pass-pipeline='builtin.module(pw-verify)x' 2>&1 | FileCheck %s --check-prefix=AFTER
// RUN: not pw-opt %s --pass-pipeline='builtin.module(pw-lower{fuse=maybe})' 2>&1 | FileCheck %s --check-prefix=FUSE
// RUN: not pw-opt %t.missing-input 2>&1 | FileCheck %s --check-prefix=MISSING
// RUN: %python -c "print('module {' * 300 + '}' * 300)" > %t.deep.mlir
// RUN: not pw-opt %t.deep.mlir 2>&1 | FileCheck %s --check-prefix=DEEP
// RUN: %python -c "print('\"pw.virtual_slice\"() {sym_name = \"v\", shape = array<i65536: 4>, axes = [\"x\"], constraints = {}} : () -> ()'); print('func.func @f() attributes {other = {d = [array<i24: 1>]}} { return }')" > %t.unreadable.mlir
// RUN: not pw-opt %t.unreadable.mlir 2>&1 | FileCheck %s --check-prefix=UNREADABLE

// Errors name the file, line and column, and no traceback is printed.

// PARSE: errors.mlir:[[@LINE+2]]:1: error: unregistered operation 'pw.comptue'
// PARSE-NOT: Traceback
"pw.comptue"() : () -> ()

// PIPELINE: pw-opt: error: invalid pass pipeline: 'pw-nope' is not a registered pass or pipeline (known: {{.*}}pw-verify
// OPTION: pw-opt: error: invalid pass pipeline: 'pw-verify' has no option 'bogus'
// PIN: pw-opt: error: invalid pass pipeline: pin 'a=island1' of 'pw-place' pins slice 'a' a second time
// NAN: pw-opt: error: invalid pass pipeline: option 'step_us' of 'pw-fuse-island' takes a finite number, not 'nan'
// A typo in a pipeline is refused, as mlir-opt refuses it, at its column.
// COMMA: pw-opt: error: invalid pass pipeline: expected ',' or ')' after 'pw-verify' at column 26, not 'p'{{$}}
// TWICE: pw-opt: error: invalid pass pipeline: option 'strategy' of 'pw-place' is given twice, again at column 39{{$}}
// AFTER: pw-opt: error: invalid pass pipeline: unexpected text after ')' at column 26: 'x'{{$}}
// FUSE: pw-opt: error: invalid pass pipeline: option 'fuse' of 'pw-lower' takes true or false, not 'maybe'{{$}}
// MISSING: missing-input: error: cannot read input: No such file or directory

// Nesting deep enough to overflow MLIR's parser is refused before parsing.
// DEEP: deep.mlir:1:2056: error: '{' nests deeper than 256 levels
// DEEP-NOT: Traceback

// An attribute the MLIR Python bindings cannot read (a dense array of an
// element type they have no class for), at any depth, on any op, is an error
// at its op, not a crash of the pass that would read it.
// UNREADABLE: unreadable.mlir:1:1: error: 'pw.virtual_slice' op attribute 'shape' cannot be read by the MLIR Python bindings: {{.*}}array<i65536: 4>
// UNREADABLE: unreadable.mlir:2:1: error: 'func.func' op attribute 'other' cannot be read by the MLIR Python bindings: {{.*}}array<i24: 1>
// UNREADABLE-NOT: Traceback
