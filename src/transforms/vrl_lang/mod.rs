//! `remap` and `filter`: transforms written in the Vector Remap Language
//! (VRL, <https://vrl.dev>), compiled once when the connector file is read.
//!
//! The program sees the payload as `.` and the message's metadata as `%`
//! (`%headers`, `%id`, `%offset`, `%timestamp`, `%origin_timestamp`,
//! `%stream`, `%topic`, `%partition`, `%key`); see [`target`]. Functions that
//! read the environment (`get_env_var`) or the system (`get_hostname`,
//! `get_timezone_name`, and those that read files: `parse_proto`,
//! `encode_proto`, `parse_etld`, `validate_json_schema`) are offered to a
//! program only when its transform enables them; the network functions are
//! not compiled in.

mod filter;
mod remap;
mod target;

use std::path::Path;

use codespan_reporting::files::SimpleFile;
use codespan_reporting::term::{self, termcolor::NoColor};
use vrl::compiler::runtime::{Runtime, RuntimeResult, Terminate};
use vrl::compiler::{CompileConfig, Function, Program, TimeZone, state::ExternalEnv};
use vrl::diagnostic::DiagnosticList;
use vrl::path::{OwnedSegment, OwnedTargetPath, PathPrefix};
use vrl::value::{KeyString, Kind, ObjectMap, Value};

use crate::message::Payload;
use crate::transforms::{FieldError, MessageMeta};
use target::{Shape, Tracked, View, payload_value};

pub use filter::Filter;
pub use remap::Remap;

/// Functions that read the process environment.
const ENV_FUNCTIONS: &[&str] = &["get_env_var"];
/// Functions that read the host or its files.
const SYSTEM_FUNCTIONS: &[&str] = &[
    "get_hostname",
    "get_timezone_name",
    "encode_proto",
    "parse_proto",
    "parse_etld",
    "validate_json_schema",
];

/// The settings `remap` and `filter` share.
#[derive(Debug, Default)]
pub(crate) struct ProgramOptions {
    /// Offer `get_env_var` to the program.
    pub enable_env_functions: bool,
    /// Offer the functions that read the host and its files.
    pub enable_system_functions: bool,
    /// Accepted so the error can say why: not compiled in.
    pub enable_network_functions: bool,
    /// The time zone for timestamps without one (`parse_timestamp`,
    /// `format_timestamp`): a TZ database name or `local`; default `UTC`.
    pub timezone: Option<String>,
}

/// Where a program's text comes from.
pub(crate) struct ProgramText {
    pub text: String,
    /// How diagnostics name it: the `.vrl` file, or the field.
    pub name: String,
    /// The transform field errors are reported on.
    pub field: &'static str,
}

impl ProgramText {
    /// `source` (inline) or `file` (read now), exactly one of them.
    pub(crate) fn load(source: Option<String>, file: Option<String>) -> Result<Self, FieldError> {
        match (source, file) {
            (Some(text), None) => Ok(Self {
                text,
                name: "source".into(),
                field: "source",
            }),
            (None, Some(path)) => {
                let text = std::fs::read_to_string(Path::new(&path)).map_err(|error| {
                    FieldError::new("file", format!("cannot read {path}: {error}"))
                })?;
                Ok(Self {
                    text,
                    name: path,
                    field: "file",
                })
            }
            (Some(_), Some(_)) => Err(FieldError::new(
                "file",
                "expected `source` or `file`, not both",
            )),
            (None, None) => Err(FieldError::new(
                "source",
                "missing required field, expected a VRL program (or `file` naming a .vrl file)",
            )),
        }
    }
}

/// Impure functions whose effect on `.` is known from the program's queries:
/// `log` writes to the log, the asserts fail the program, and `del` deletes
/// the path it is given, a query.
const IMPURE_KNOWN: &[&str] = &["log", "assert", "assert_eq", "del"];

/// A compiled program and what it needs at run time.
#[derive(Debug)]
pub(crate) struct Compiled {
    pub program: Program,
    pub timezone: TimeZone,
    /// The program reads or writes `%`: metadata is built for it.
    pub uses_metadata: bool,
    /// What the program needs of the payload as `.`.
    pub view: View,
    /// Running the program can change nothing, fail or abort, nor do
    /// anything else seen outside it (`log`): a `remap` of it is skipped.
    pub inert: bool,
    /// A condition whose errors are raised at run time by our wrapper, not
    /// by the text as written (see [`compile`]).
    pub deferred_errors: bool,
}

impl Compiled {
    /// Runs the program on the payload (the part of it the program reads)
    /// and, when it uses them, the message's metadata. Returns the target as
    /// the program left it and the payload's shape; an error when the payload
    /// cannot be read (JSON bytes that are not JSON).
    pub(crate) fn run(
        &self,
        payload: &Payload,
        meta: &MessageMeta<'_>,
    ) -> Result<(Tracked, Shape, RuntimeResult), String> {
        let (value, shape) = payload_value(payload, &self.view)?;
        let metadata = if self.uses_metadata {
            target::metadata(meta)
        } else {
            Value::Object(ObjectMap::new())
        };
        let mut target = Tracked::new(value, metadata);
        // A runtime per message: its state is the program's local variables,
        // empty (and unallocated) until the program assigns one.
        let outcome = Runtime::default().resolve(&mut target, &self.program, &self.timezone);
        Ok((target, shape, outcome))
    }
}

impl Compiled {
    /// A runtime error as the user should read it: without the wrapper's
    /// `function call error for "assert" at (..)` around a deferred one.
    pub(crate) fn error_text(&self, error: &Terminate) -> String {
        let text = error.to_string();
        match text.split_once("): ") {
            Some((_, message)) if self.deferred_errors => message.to_owned(),
            _ => text,
        }
    }
}

/// Which paths a program may assign to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    /// `.`, `%headers` and `%key`.
    Remap,
    /// Nothing: a condition only reads.
    ReadOnly,
}

/// Compiles `text`; a compile error is VRL's own diagnostic, rendered with
/// the program's name, line, column and caret.
pub(crate) fn compile(
    text: &ProgramText,
    options: &ProgramOptions,
    access: Access,
) -> Result<Compiled, FieldError> {
    if options.enable_network_functions {
        return Err(FieldError::new(
            "enable_network_functions",
            "the network functions (http_request, dns_lookup, reverse_dns) are not compiled into this binary",
        ));
    }
    let timezone = match options.timezone.as_deref() {
        None => TimeZone::parse("UTC").unwrap_or_default(),
        Some(name) => TimeZone::parse(name).ok_or_else(|| {
            FieldError::new(
                "timezone",
                format!("unknown time zone \"{name}\"; expected a TZ database name (\"Europe/Warsaw\") or \"local\""),
            )
        })?,
    };
    let functions = functions(options);
    // `.` is whatever the payload decodes to: an object, text, bytes, ...
    let external = ExternalEnv::new_with_kind(Kind::any(), target::metadata_kind());
    let compile_text = |source: &str| {
        vrl::compiler::compile_with_external(source, &functions, &external, config_for(access))
    };
    let mut deferred_errors = false;
    let mut compiled_text = std::borrow::Cow::Borrowed(text.text.as_str());
    let result = match compile_text(&text.text) {
        Ok(result) => Ok(result),
        // A condition that can fail (`.latency_ms > 500` on a field of any
        // type) fails the message at run time, like any transform error,
        // instead of refusing the program: its error is raised by `assert!`.
        // The condition stays on the first line, so positions keep their
        // meaning; any other problem is reported on the text as written.
        Err(diagnostics)
            if access == Access::ReadOnly
                && diagnostics.iter().all(|diagnostic| diagnostic.code == 100) =>
        {
            let deferred = format!(
                "_condition_ok, _condition_error = ({})\n\
                 if _condition_error != null {{ assert!(false, message: string!(_condition_error)) }}\n\
                 _condition_ok",
                text.text
            );
            deferred_errors = true;
            let result = compile_text(&deferred).map_err(|_| diagnostics);
            compiled_text = std::borrow::Cow::Owned(deferred);
            result
        }
        Err(diagnostics) => Err(diagnostics),
    }
    .map_err(|diagnostics| {
        FieldError::new(
            text.field,
            format!(
                "VRL program does not compile:\n{}",
                render(&text.name, &text.text, diagnostics)
            ),
        )
    })?;
    for warning in result.warnings.iter() {
        tracing::warn!(program = %text.name, warning = %warning.message, "VRL compile warning");
    }
    let info = result.program.info();
    let on_metadata = |path: &OwnedTargetPath| path.prefix == PathPrefix::Metadata;
    let uses_metadata = info.target_assignments.iter().any(on_metadata)
        || info.target_queries.iter().any(on_metadata);
    // The program text is compiled again without some impure functions to
    // learn whether it calls them (at load only): a program that compiles
    // without them calls none.
    let compiles_without = |drop: &dyn Fn(&dyn Function) -> bool| {
        let kept: Vec<Box<dyn Function>> = self::functions(options)
            .into_iter()
            .filter(|function| !drop(function.as_ref()))
            .collect();
        vrl::compiler::compile_with_external(&compiled_text, &kept, &external, config_for(access))
            .is_ok()
    };
    let calls_no_impure = compiles_without(&|function| !function.pure());
    let calls_only_known = calls_no_impure
        || compiles_without(&|function| {
            !function.pure() && !IMPURE_KNOWN.contains(&function.identifier())
        });
    // What the program reads and writes of `.`: `del(.x)` is not an
    // assignment, but its path is a query.
    let on_payload = |path: &&OwnedTargetPath| path.prefix == PathPrefix::Event;
    let view = if calls_only_known {
        fields_read(
            info.target_queries
                .iter()
                .chain(&info.target_assignments)
                .filter(on_payload),
        )
    } else {
        View::Whole
    };
    let inert =
        info.target_assignments.is_empty() && calls_no_impure && !info.fallible && !info.abortable;
    Ok(Compiled {
        program: result.program,
        timezone,
        uses_metadata,
        view,
        inert,
        deferred_errors,
    })
}

/// `apply` of a VRL transform, for callers without the message's metadata:
/// the program runs with empty headers, as on a sink.
fn apply_without_meta(
    transform: &impl crate::transforms::Transform,
    payload: &mut Payload,
) -> Result<crate::transforms::Verdict, crate::transforms::TransformError> {
    let mut headers = crate::message::Headers::new();
    transform.apply_with(
        payload,
        &mut MessageMeta::headers_only(crate::transforms::Side::Sink, &mut headers),
    )
}

/// The top-level fields of `.` that `paths` read or write, or the whole
/// payload when one is `.` itself or starts with an index.
fn fields_read<'a>(paths: impl Iterator<Item = &'a OwnedTargetPath>) -> View {
    let mut fields: Vec<KeyString> = Vec::new();
    for path in paths {
        match path.path.segments.first() {
            Some(OwnedSegment::Field(field)) => {
                if !fields.contains(field) {
                    fields.push(field.clone());
                }
            }
            _ => return View::Whole,
        }
    }
    View::Fields(fields)
}

/// What a program may assign to, as the compiler checks it.
fn config_for(access: Access) -> CompileConfig {
    let mut config = CompileConfig::default();
    match access {
        Access::ReadOnly => config.set_read_only(),
        Access::Remap => {
            for field in target::READ_ONLY_METADATA {
                config.set_read_only_path(
                    OwnedTargetPath::metadata(vrl::owned_value_path!(*field)),
                    true,
                );
            }
        }
    }
    config
}

/// The stdlib, less the env and system functions the transform did not enable.
fn functions(options: &ProgramOptions) -> Vec<Box<dyn Function>> {
    vrl::stdlib::all()
        .into_iter()
        .filter(|function| {
            let name = function.identifier();
            (options.enable_env_functions || !ENV_FUNCTIONS.contains(&name))
                && (options.enable_system_functions || !SYSTEM_FUNCTIONS.contains(&name))
        })
        .collect()
}

/// VRL's diagnostics as its CLI prints them, naming `name` as the file.
fn render(name: &str, source: &str, diagnostics: DiagnosticList) -> String {
    let file = SimpleFile::new(name, source);
    let config = term::Config::default();
    let mut buffer = NoColor::new(Vec::new());
    for diagnostic in diagnostics {
        let diagnostic: codespan_reporting::diagnostic::Diagnostic<()> = diagnostic.into();
        if term::emit(&mut buffer, &config, &file, &diagnostic).is_err() {
            return "(the diagnostic could not be rendered)".into();
        }
    }
    String::from_utf8_lossy(&buffer.into_inner())
        .lines()
        .map(str::trim_end)
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests;
