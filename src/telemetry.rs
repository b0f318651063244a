//! tracing setup: text or JSON logs, filtered by `RUST_LOG` (default `info`).
//!
//! Text logs are one line per event whatever the fields hold: a pod name, namespace or error
//! with a line break or another control character in it is written escaped (`\n`, `\u{1b}`),
//! so that a request cannot forge log lines. JSON logs escape by construction.

use std::io::{IsTerminal, Write};

use clap::ValueEnum;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// Installs the global subscriber. Safe to call more than once (later calls do nothing).
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        EnvFilter::new("info,hyper=warn,h2=warn,rustls=warn,tower=warn,kube_client=warn")
    });
    let ansi = std::io::stderr().is_terminal();
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    let _ = match format {
        LogFormat::Text => builder
            .with_ansi(ansi)
            .with_writer(OneLine {
                keep_escape: ansi,
                inner: std::io::stderr,
            })
            .try_init(),
        LogFormat::Json => builder
            .with_writer(std::io::stderr)
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .try_init(),
    };
}

/// A writer that keeps each event on one line (the formatter writes an event in one call).
#[derive(Clone, Copy)]
pub struct OneLine<M> {
    /// Leave ESC alone (the formatter's own colours on a terminal).
    pub keep_escape: bool,
    pub inner: M,
}

impl<'a, M: MakeWriter<'a>> MakeWriter<'a> for OneLine<M> {
    type Writer = OneLineWriter<M::Writer>;
    fn make_writer(&'a self) -> Self::Writer {
        OneLineWriter {
            keep_escape: self.keep_escape,
            inner: self.inner.make_writer(),
        }
    }
}

pub struct OneLineWriter<W> {
    keep_escape: bool,
    inner: W,
}

impl<W: Write> Write for OneLineWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        let body = text.strip_suffix('\n').unwrap_or(&text);
        let escaped = escape_controls(body, self.keep_escape);
        let ends_line = body.len() < text.len();
        if ends_line {
            self.inner.write_all(format!("{escaped}\n").as_bytes())?;
        } else {
            self.inner.write_all(escaped.as_bytes())?;
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// `s` with every control character but tab written as an escape (`\n`, `\r`, `\u{7f}`).
pub fn escape_controls(s: &str, keep_escape: bool) -> std::borrow::Cow<'_, str> {
    let needs = |c: char| c.is_control() && c != '\t' && !(keep_escape && c == '\u{1b}');
    if !s.chars().any(needs) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if needs(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_line_break_in_a_field_cannot_forge_a_line() {
        let sink = Sink::default();
        let out = sink.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(OneLine {
                keep_escape: false,
                inner: move || sink.clone(),
            })
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let pod =
                "ml/p\n2026-11-23T00:00:00Z  INFO gpu_share: bound pod=kube-system/x\r\u{1b}[2J";
            tracing::info!(pod = %pod, "bind refused");
            tracing::warn!("second");
        });
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(lines[0].contains(r"ml/p\n2026-11-23"), "{text}");
        assert!(lines[0].contains(r"\r\u{1b}[2J"), "{text}");
        assert!(lines[1].contains("second"));
    }

    #[test]
    fn clean_text_is_not_copied() {
        assert!(matches!(
            escape_controls("plain\ttext", false),
            std::borrow::Cow::Borrowed(_)
        ));
        assert_eq!(escape_controls("a\u{7f}b", false), r"a\u{7f}b");
        assert_eq!(escape_controls("\u{1b}[1m", true), "\u{1b}[1m");
    }
}
