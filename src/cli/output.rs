//! Standard output for every command: a reader that goes away early (`dubbo-cp status | head
//! -1`) ends the command quietly with success, as Unix tools do, instead of the panic
//! `println!` raises on a closed pipe.

use std::io::Write;

/// Writes `args` (and a newline, when `newline`) to standard output; exits on a closed pipe.
pub fn write(args: std::fmt::Arguments<'_>, newline: bool) {
    let mut out = std::io::stdout().lock();
    let written = out.write_fmt(args).and_then(|()| {
        if newline {
            out.write_all(b"\n")
        } else {
            Ok(())
        }
    });
    if let Err(err) = written {
        if err.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("dubbo-cp: cannot write to standard output: {err}");
        std::process::exit(1);
    }
}

/// `println!` that ends the command quietly when standard output is closed.
macro_rules! outln {
    () => { $crate::cli::output::write(format_args!(""), true) };
    ($($arg:tt)*) => { $crate::cli::output::write(format_args!($($arg)*), true) };
}

/// `print!` that ends the command quietly when standard output is closed.
macro_rules! out {
    ($($arg:tt)*) => { $crate::cli::output::write(format_args!($($arg)*), false) };
}
