// RUN: pw-opt %s --split-input-file --verify-diagnostics

// Literals that MLIR's parser or its Python bindings abort on (SIGABRT, or an
// internal error naming no place) are refused before parsing, at the literal.
// Inside comments and string literals they are text: array<index: 1>, "\ff".

// A dense array of index (MLIR asserts that its elements have a bit width).
// expected-error@+1 {{array<index ...> is not supported: write array<i64: ...>}}
"pw.virtual_slice"() {sym_name = "a", shape = array<index: 2>, axes = ["x"], constraints = {}} : () -> ()

// -----

// expected-error@+1 {{array<index ...> is not supported}}
"x.op"() {empty = array<index>} : () -> ()

// -----

// Through type aliases too.
!i = index
!j = !i
// expected-error@+1 {{array<!j ...> is not supported (!j is index): write array<i64: ...>}}
"x.op"() {a = array<!j: 1, 2>, note = "array<index: 1>"} : () -> ()

// -----

// A string whose escapes make bytes that are not UTF-8: a value, a nested
// dictionary key, an op name.
// expected-error@+1 {{string literal is not UTF-8 once its escapes are decoded}}
"pw.virtual_slice"() {sym_name = "\ff", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()

// -----

// expected-error@+1 {{string literal is not UTF-8 once its escapes are decoded}}
"x.op"() {a = {"\ff" = 1}} : () -> ()

// -----

// expected-error@+1 {{string literal is not UTF-8 once its escapes are decoded}}
"pw.virtual\ffslice"() : () -> ()

// -----

// Escapes of UTF-8 text, and an escaped backslash before hex digits, are fine.
"x.op"() {e_acute = "\c3\a9", backslash = "\\ff", quote = "\"\n\t"} : () -> ()

// -----

// What an unregistered dialect's attribute or type keeps opaque is not parsed
// as a dense array.
"x.op"() {a = #x<array<index: 1>>, b = !x.t<array<index>>} : () -> ()
