//! What an address symbolizes to: one [`Frame`] per function, inlined call or unresolved
//! address, with its [`FrameKind`] (kernel, native, Python, JIT). The profile and every
//! exporter read these.

/// The runtime that JIT-compiled a frame's code (named from its perf map).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum JitRuntime {
    /// Node.js / V8 (`--perf-basic-prof`).
    V8,
    /// A Java virtual machine (HotSpot `Compiler.perfmap`, `-XX:+DumpPerfMapAtExit`).
    Jvm,
    /// .NET (`DOTNET_PerfMapEnabled=1`).
    DotNet,
    /// CPython 3.12+ perf trampolines (`-X perf`).
    CPython,
    /// Any other runtime writing `/tmp/perf-PID.map` (LuaJIT, ...).
    #[default]
    Other,
}

impl JitRuntime {
    /// The runtime of a process, from its command name or executable's file name.
    pub fn of_process(name: &str) -> Self {
        let base = name.rsplit('/').next().unwrap_or(name);
        if base == "node" || base == "nodejs" || base.starts_with("node-") {
            Self::V8
        } else if base == "java" || base.starts_with("java") {
            Self::Jvm
        } else if base == "dotnet" {
            Self::DotNet
        } else if base.starts_with("python") {
            Self::CPython
        } else {
            Self::Other
        }
    }
}

/// What kind of code a frame is, as profilers colour and label it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum FrameKind {
    /// Machine code from a mapped file (ELF symbols + DWARF), or an unresolved user address.
    #[default]
    Native,
    /// Kernel code (kallsyms).
    Kernel,
    /// A Python function, named by the interpreter's own frames.
    Python,
    /// Code a runtime compiled at run time, named from its perf map.
    Jit(JitRuntime),
}

impl FrameKind {
    /// The OpenTelemetry profiles semantic-convention name (`profile.frame.type`):
    /// `native`, `kernel`, `cpython`, `v8js`, `jvm`, `dotnet`, and `jit` for a runtime the
    /// convention does not name.
    pub fn otel_name(self) -> &'static str {
        match self {
            Self::Native => "native",
            Self::Kernel => "kernel",
            Self::Python | Self::Jit(JitRuntime::CPython) => "cpython",
            Self::Jit(JitRuntime::V8) => "v8js",
            Self::Jit(JitRuntime::Jvm) => "jvm",
            Self::Jit(JitRuntime::DotNet) => "dotnet",
            Self::Jit(JitRuntime::Other) => "jit",
        }
    }

    /// A short label for people (legends, `top`): `native`, `kernel`, `python`, `jit`.
    pub fn label(self) -> &'static str {
        match self {
            Self::Native => "native",
            Self::Kernel => "kernel",
            Self::Python => "python",
            Self::Jit(_) => "jit",
        }
    }

    /// True for frames named by a language runtime (Python, JIT), not by ELF/DWARF.
    pub fn is_managed(self) -> bool {
        matches!(self, Self::Python | Self::Jit(_))
    }
}

/// One code location (a symbol, an inlined call, or an unresolved `module+0xOFFSET`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Frame {
    /// Demangled function name, or `module+0xOFFSET` / `[kernel]+0xADDR` when unresolved.
    pub function: String,
    /// Source file, when DWARF (or the runtime) knows it.
    pub file: Option<String>,
    /// Source line, when DWARF (or the runtime) knows it.
    pub line: Option<u32>,
    /// Path of the mapped file (`[kernel]` for kernel frames, `[jit]` / `[python]` for
    /// frames named by a runtime).
    pub module: String,
    /// True for a function inlined into the next frame (its caller).
    pub inlined: bool,
    /// What kind of code this is.
    pub kind: FrameKind,
}

/// Module name of frames named from a perf map.
pub const JIT_MODULE: &str = "[jit]";
/// Module name of frames named by the Python interpreter's frames.
pub const PYTHON_MODULE: &str = "[python]";

impl Frame {
    /// The frame of an address nothing could resolve: `module+0xOFFSET`, module's file name.
    pub fn unresolved(module: &str, offset: u64, kind: FrameKind) -> Self {
        let name = module.rsplit('/').next().unwrap_or(module);
        Self {
            function: format!("{name}+0x{offset:x}"),
            file: None,
            line: None,
            module: module.to_string(),
            inlined: false,
            kind,
        }
    }

    /// A Python function: its qualified name, source file and line (when known).
    pub fn python(qualname: &str, file: Option<&str>, line: Option<u32>) -> Self {
        Self {
            function: qualname.to_string(),
            file: file.map(str::to_string),
            line,
            module: PYTHON_MODULE.to_string(),
            inlined: false,
            kind: FrameKind::Python,
        }
    }

    /// A JIT-compiled function named from a perf map. File and line stay unset; use
    /// [`Frame::with_source`] when the runtime's name carries them.
    pub fn jit(name: &str, runtime: JitRuntime) -> Self {
        Self {
            function: name.to_string(),
            file: None,
            line: None,
            module: JIT_MODULE.to_string(),
            inlined: false,
            kind: FrameKind::Jit(runtime),
        }
    }

    /// This frame with a source file and line.
    pub fn with_source(mut self, file: Option<String>, line: Option<u32>) -> Self {
        self.file = file;
        self.line = line;
        self
    }

    /// How reports name the frame: a Python or JIT function with its source as
    /// `name (file:line)` (many scripts share function names); any other frame by its name.
    pub fn display_name(&self) -> std::borrow::Cow<'_, str> {
        match (&self.file, self.kind.is_managed()) {
            (Some(file), true) => {
                let file = file.rsplit('/').next().unwrap_or(file);
                match self.line {
                    Some(line) => format!("{} ({file}:{line})", self.function).into(),
                    None => format!("{} ({file})", self.function).into(),
                }
            }
            _ => self.function.as_str().into(),
        }
    }

    /// True for kernel frames.
    pub fn is_kernel(&self) -> bool {
        self.kind == FrameKind::Kernel
    }

    /// True for a frame made by [`Frame::unresolved`]: no symbol was found for it.
    pub fn is_unresolved(&self) -> bool {
        let name = self.module.rsplit('/').next().unwrap_or(&self.module);
        self.file.is_none()
            && self
                .function
                .strip_prefix(name)
                .and_then(|rest| rest.strip_prefix("+0x"))
                .is_some_and(|hex| !hex.is_empty() && hex.bytes().all(|b| b.is_ascii_hexdigit()))
    }

    /// A synthetic frame (e.g. `crate::profile::NO_STACK_SAMPLE`).
    pub fn synthetic(function: &str) -> Self {
        Self {
            function: function.to_string(),
            file: None,
            line: None,
            module: "[energy-bpf]".to_string(),
            inlined: false,
            kind: FrameKind::Native,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn otel_names_follow_the_convention() {
        assert_eq!(Frame::python("f", None, None).kind.otel_name(), "cpython");
        assert_eq!(Frame::jit("f", JitRuntime::V8).kind.otel_name(), "v8js");
        assert_eq!(Frame::jit("f", JitRuntime::Jvm).kind.otel_name(), "jvm");
        assert_eq!(Frame::jit("f", JitRuntime::Other).kind.otel_name(), "jit");
        assert_eq!(FrameKind::Kernel.otel_name(), "kernel");
        assert_eq!(Frame::synthetic("x").kind.otel_name(), "native");
    }

    #[test]
    fn managed_frames_show_their_source() {
        let py = Frame::python("Worker.run", Some("/srv/app/worker.py"), Some(42));
        assert_eq!(py.display_name(), "Worker.run (worker.py:42)");
        let js = Frame::jit("heavy", JitRuntime::V8).with_source(Some("/t/a.js".into()), None);
        assert_eq!(js.display_name(), "heavy (a.js)");
        let mut native = Frame::synthetic("main");
        native.file = Some("/src/main.c".into());
        assert_eq!(
            native.display_name(),
            "main",
            "native rows keep their names"
        );
    }

    #[test]
    fn runtime_from_process_name() {
        assert_eq!(JitRuntime::of_process("/usr/bin/node"), JitRuntime::V8);
        assert_eq!(JitRuntime::of_process("java"), JitRuntime::Jvm);
        assert_eq!(JitRuntime::of_process("python3.12"), JitRuntime::CPython);
        assert_eq!(JitRuntime::of_process("luajit"), JitRuntime::Other);
    }
}
