//! What an address symbolizes to: one [`Frame`] per function, inlined call or unresolved
//! address. The profile and every exporter read these.

/// One code location (a symbol, an inlined call, or an unresolved `module+0xOFFSET`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Frame {
    /// Demangled function name, or `module+0xOFFSET` / `[kernel]+0xADDR` when unresolved.
    pub function: String,
    /// Source file, when DWARF knows it.
    pub file: Option<String>,
    /// Source line, when DWARF knows it.
    pub line: Option<u32>,
    /// Path of the mapped file (`[kernel]` for kernel frames).
    pub module: String,
    /// True for a function inlined into the next frame (its caller).
    pub inlined: bool,
    /// True for kernel frames.
    pub kernel: bool,
}

impl Frame {
    /// The frame of an address nothing could resolve: `module+0xOFFSET`, module's file name.
    pub fn unresolved(module: &str, offset: u64, kernel: bool) -> Self {
        let name = module.rsplit('/').next().unwrap_or(module);
        Self {
            function: format!("{name}+0x{offset:x}"),
            file: None,
            line: None,
            module: module.to_string(),
            inlined: false,
            kernel,
        }
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

    /// A synthetic frame (e.g. [`crate::profile::NO_STACK_SAMPLE`]).
    pub fn synthetic(function: &str) -> Self {
        Self {
            function: function.to_string(),
            file: None,
            line: None,
            module: "[energy-bpf]".to_string(),
            inlined: false,
            kernel: false,
        }
    }
}
