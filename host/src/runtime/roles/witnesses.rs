//! One witness per interface a role may import: the imports of a component
//! that uses one item the host must really provide for that interface (a
//! function or a resource, with its exact type), at the oldest version a
//! guest may have been built against. A component that imports an empty
//! instance would link whether or not the host links the interface:
//! wasmtime looks up only the items an imported instance declares.
//!
//! An interface that holds only types (`edgeroute:routing/types`,
//! `completion-types`) has nothing to link, so its witness is empty.
//! Interfaces that use another's resource import that one too.

/// `(interface, imports)`; keep in step with the roles' `ALLOWED` (the
/// test fails on an allowed interface that has no witness).
const WITNESSES: &[(&str, &str)] = &[
    (
        "wasi:cli/environment",
        r#"(import "wasi:cli/environment@0.2.0" (instance
             (export "get-arguments" (func (result (list string))))))"#,
    ),
    (
        "wasi:cli/exit",
        r#"(import "wasi:cli/exit@0.2.0" (instance
             (export "exit" (func (param "status" (result))))))"#,
    ),
    (
        "wasi:cli/stdin",
        r#"(import "wasi:io/streams@0.2.0" (instance $streams
             (export "input-stream" (type (sub resource)))))
           (alias export $streams "input-stream" (type $input-stream))
           (import "wasi:cli/stdin@0.2.0" (instance
             (alias outer 1 $input-stream (type $input-stream))
             (export "get-stdin" (func (result (own $input-stream))))))"#,
    ),
    (
        "wasi:cli/stdout",
        r#"(import "wasi:io/streams@0.2.0" (instance $streams
             (export "output-stream" (type (sub resource)))))
           (alias export $streams "output-stream" (type $output-stream))
           (import "wasi:cli/stdout@0.2.0" (instance
             (alias outer 1 $output-stream (type $output-stream))
             (export "get-stdout" (func (result (own $output-stream))))))"#,
    ),
    (
        "wasi:cli/stderr",
        r#"(import "wasi:io/streams@0.2.0" (instance $streams
             (export "output-stream" (type (sub resource)))))
           (alias export $streams "output-stream" (type $output-stream))
           (import "wasi:cli/stderr@0.2.0" (instance
             (alias outer 1 $output-stream (type $output-stream))
             (export "get-stderr" (func (result (own $output-stream))))))"#,
    ),
    (
        "wasi:cli/terminal-input",
        r#"(import "wasi:cli/terminal-input@0.2.0" (instance
             (export "terminal-input" (type (sub resource)))))"#,
    ),
    (
        "wasi:cli/terminal-output",
        r#"(import "wasi:cli/terminal-output@0.2.0" (instance
             (export "terminal-output" (type (sub resource)))))"#,
    ),
    (
        "wasi:cli/terminal-stdin",
        r#"(import "wasi:cli/terminal-input@0.2.0" (instance $input
             (export "terminal-input" (type (sub resource)))))
           (alias export $input "terminal-input" (type $terminal-input))
           (import "wasi:cli/terminal-stdin@0.2.0" (instance
             (alias outer 1 $terminal-input (type $terminal-input))
             (export "get-terminal-stdin" (func (result (option (own $terminal-input)))))))"#,
    ),
    (
        "wasi:cli/terminal-stdout",
        r#"(import "wasi:cli/terminal-output@0.2.0" (instance $output
             (export "terminal-output" (type (sub resource)))))
           (alias export $output "terminal-output" (type $terminal-output))
           (import "wasi:cli/terminal-stdout@0.2.0" (instance
             (alias outer 1 $terminal-output (type $terminal-output))
             (export "get-terminal-stdout" (func (result (option (own $terminal-output)))))))"#,
    ),
    (
        "wasi:cli/terminal-stderr",
        r#"(import "wasi:cli/terminal-output@0.2.0" (instance $output
             (export "terminal-output" (type (sub resource)))))
           (alias export $output "terminal-output" (type $terminal-output))
           (import "wasi:cli/terminal-stderr@0.2.0" (instance
             (alias outer 1 $terminal-output (type $terminal-output))
             (export "get-terminal-stderr" (func (result (option (own $terminal-output)))))))"#,
    ),
    (
        "wasi:clocks/monotonic-clock",
        r#"(import "wasi:clocks/monotonic-clock@0.2.0" (instance
             (export "now" (func (result u64)))))"#,
    ),
    (
        "wasi:clocks/wall-clock",
        r#"(import "wasi:clocks/wall-clock@0.2.0" (instance
             (type $datetime (record (field "seconds" u64) (field "nanoseconds" u32)))
             (export "datetime" (type $datetime-export (eq $datetime)))
             (export "now" (func (result $datetime-export)))))"#,
    ),
    (
        "wasi:io/error",
        r#"(import "wasi:io/error@0.2.0" (instance
             (export "error" (type (sub resource)))))"#,
    ),
    (
        "wasi:io/poll",
        r#"(import "wasi:io/poll@0.2.0" (instance
             (export "pollable" (type (sub resource)))))"#,
    ),
    (
        "wasi:io/streams",
        r#"(import "wasi:io/streams@0.2.0" (instance
             (export "input-stream" (type (sub resource)))))"#,
    ),
    (
        "wasi:random/random",
        r#"(import "wasi:random/random@0.2.0" (instance
             (export "get-random-u64" (func (result u64)))))"#,
    ),
    (
        "wasi:random/insecure",
        r#"(import "wasi:random/insecure@0.2.0" (instance
             (export "get-insecure-random-u64" (func (result u64)))))"#,
    ),
    (
        "wasi:random/insecure-seed",
        r#"(import "wasi:random/insecure-seed@0.2.0" (instance
             (export "insecure-seed" (func (result (tuple u64 u64))))))"#,
    ),
    (
        "edgeroute:routing/types",
        r#"(import "edgeroute:routing/types@0.1.0" (instance))"#,
    ),
    (
        "edgeroute:routing/host",
        r#"(import "edgeroute:routing/host@0.2.0" (instance
             (export "now-ms" (func (result u64)))))"#,
    ),
    (
        "edgeroute:routing/completion-types",
        r#"(import "edgeroute:routing/completion-types@0.1.0" (instance))"#,
    ),
    (
        "edgeroute:routing/sink",
        r#"(import "edgeroute:routing/sink@0.1.0" (instance
             (export "emit" (func (param "delta" string) (result bool)))))"#,
    ),
    (
        "wasi:nn/graph",
        r#"(import "wasi:nn/graph@0.2.0-rc-2024-10-28" (instance
             (export "graph" (type (sub resource)))))"#,
    ),
    (
        "wasi:nn/inference",
        r#"(import "wasi:nn/inference@0.2.0-rc-2024-10-28" (instance
             (export "graph-execution-context" (type (sub resource)))))"#,
    ),
    (
        "wasi:nn/tensor",
        r#"(import "wasi:nn/tensor@0.2.0-rc-2024-10-28" (instance
             (export "tensor" (type (sub resource)))))"#,
    ),
    (
        "wasi:nn/errors",
        r#"(import "wasi:nn/errors@0.2.0-rc-2024-10-28" (instance
             (export "error" (type (sub resource)))))"#,
    ),
    (
        "wasi:http/types",
        r#"(import "wasi:http/types@0.2.0" (instance
             (export "fields" (type (sub resource)))))"#,
    ),
    (
        "wasi:http/outgoing-handler",
        r#"(import "wasi:http/types@0.2.0" (instance $types
             (export "outgoing-request" (type (sub resource)))
             (export "request-options" (type (sub resource)))
             (export "future-incoming-response" (type (sub resource)))
             (type $dns (record (field "rcode" (option string)) (field "info-code" (option u16))))
             (export "DNS-error-payload" (type $dns-payload (eq $dns)))
             (type $tls (record (field "alert-id" (option u8)) (field "alert-message" (option string))))
             (export "TLS-alert-received-payload" (type $tls-payload (eq $tls)))
             (type $size (record (field "field-name" (option string)) (field "field-size" (option u32))))
             (export "field-size-payload" (type $size-payload (eq $size)))
             (type $error-code (variant
               (case "DNS-timeout")
               (case "DNS-error" $dns-payload)
               (case "destination-not-found")
               (case "destination-unavailable")
               (case "destination-IP-prohibited")
               (case "destination-IP-unroutable")
               (case "connection-refused")
               (case "connection-terminated")
               (case "connection-timeout")
               (case "connection-read-timeout")
               (case "connection-write-timeout")
               (case "connection-limit-reached")
               (case "TLS-protocol-error")
               (case "TLS-certificate-error")
               (case "TLS-alert-received" $tls-payload)
               (case "HTTP-request-denied")
               (case "HTTP-request-length-required")
               (case "HTTP-request-body-size" (option u64))
               (case "HTTP-request-method-invalid")
               (case "HTTP-request-URI-invalid")
               (case "HTTP-request-URI-too-long")
               (case "HTTP-request-header-section-size" (option u32))
               (case "HTTP-request-header-size" (option $size-payload))
               (case "HTTP-request-trailer-section-size" (option u32))
               (case "HTTP-request-trailer-size" $size-payload)
               (case "HTTP-response-incomplete")
               (case "HTTP-response-header-section-size" (option u32))
               (case "HTTP-response-header-size" $size-payload)
               (case "HTTP-response-body-size" (option u64))
               (case "HTTP-response-trailer-section-size" (option u32))
               (case "HTTP-response-trailer-size" $size-payload)
               (case "HTTP-response-transfer-coding" (option string))
               (case "HTTP-response-content-coding" (option string))
               (case "HTTP-response-timeout")
               (case "HTTP-upgrade-failed")
               (case "HTTP-protocol-error")
               (case "loop-detected")
               (case "configuration-error")
               (case "internal-error" (option string))))
             (export "error-code" (type (eq $error-code)))))
           (alias export $types "outgoing-request" (type $outgoing-request))
           (alias export $types "request-options" (type $request-options))
           (alias export $types "future-incoming-response" (type $future-incoming-response))
           (alias export $types "error-code" (type $error-code))
           (import "wasi:http/outgoing-handler@0.2.0" (instance
             (alias outer 1 $outgoing-request (type $request))
             (alias outer 1 $request-options (type $options))
             (alias outer 1 $future-incoming-response (type $response))
             (alias outer 1 $error-code (type $error-code))
             (export "handle" (func
               (param "request" (own $request))
               (param "options" (option (own $options)))
               (result (result (own $response) (error $error-code)))))))"#,
    ),
];

/// A component text holding the witness of `interface`.
pub fn component(interface: &str) -> String {
    let (_, imports) = WITNESSES
        .iter()
        .find(|(name, _)| *name == interface)
        .unwrap_or_else(|| panic!("no witness for {interface}: add one to witnesses.rs"));
    format!("(component\n{imports})")
}
