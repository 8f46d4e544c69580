//! Which parts of an engine's command line changed, from two `argv` fingerprint fields (the argv
//! joined by single spaces), read without knowing the program's flags: a token starting with `-`
//! (not a number, not `--`) is a flag; its value is what follows `=`, else the next token when that is
//! no flag; a flag given several times keeps all its values in order; `--` ends the flags. The rest
//! are positional arguments, compared by their order among themselves.

use std::collections::BTreeMap;

/// One command line, taken apart.
#[derive(Debug, Default)]
struct Parsed<'a> {
    /// Flag -> its values in order (`None`: given without a value), with the token index it first appears at.
    flags: BTreeMap<&'a str, (usize, Vec<Option<&'a str>>)>,
    /// (token index, token) of each positional argument, the program first.
    positionals: Vec<(usize, &'a str)>,
}

fn is_flag(token: &str) -> bool {
    token.len() > 1 && token.starts_with('-') && token != "--" && token.parse::<f64>().is_err()
}

fn parse(argv: &str) -> Parsed<'_> {
    let tokens: Vec<&str> = argv.split(' ').filter(|t| !t.is_empty()).collect();
    let mut parsed = Parsed::default();
    let (mut i, mut flags_end) = (0, false);
    while i < tokens.len() {
        let token = tokens[i];
        if !flags_end && token == "--" {
            flags_end = true;
        } else if !flags_end && is_flag(token) {
            let (name, value) = match token.split_once('=') {
                Some((name, value)) => (name, Some(value)),
                None => match tokens.get(i + 1) {
                    Some(&next) if !is_flag(next) && next != "--" => {
                        i += 1;
                        (token, Some(next))
                    }
                    _ => (token, None),
                },
            };
            parsed.flags.entry(name).or_insert_with(|| (i, Vec::new())).1.push(value);
        } else {
            parsed.positionals.push((i, token));
        }
        i += 1;
    }
    parsed
}

/// The flags (`--ctx-size`, `-np`) whose values differ between `old` and `new`, added or removed
/// ones included, and `argv[N]` for a positional argument that differs (N: its token index in `new`,
/// or in `old` when `new` has fewer); in `new`'s order, then what only `old` had.
pub fn changed(old: &str, new: &str) -> Vec<String> {
    let (old, new) = (parse(old), parse(new));
    let mut found: Vec<((bool, usize), String)> = Vec::new();
    for name in old.flags.keys().chain(new.flags.keys()) {
        let (before, after) = (old.flags.get(name), new.flags.get(name));
        if before.map(|f| &f.1) != after.map(|f| &f.1) && !found.iter().any(|(_, n)| n == name) {
            let at = match (after, before) {
                (Some((at, _)), _) => (false, *at),
                (None, Some((at, _))) => (true, *at),
                (None, None) => continue,
            };
            found.push((at, name.to_string()));
        }
    }
    for k in 0..old.positionals.len().max(new.positionals.len()) {
        let (before, after) = (old.positionals.get(k), new.positionals.get(k));
        if before.map(|p| p.1) != after.map(|p| p.1) {
            let at = match (after, before) {
                (Some((at, _)), _) => (false, *at),
                (None, Some((at, _))) => (true, *at),
                (None, None) => continue,
            };
            found.push((at, format!("argv[{}]", at.1)));
        }
    }
    found.sort();
    found.into_iter().map(|(_, name)| name).collect()
}

#[cfg(test)]
mod tests {
    use super::changed;

    #[test]
    fn a_changed_value_and_an_added_flag() {
        let old = "llama-server -m m.gguf --port 8080 --ctx-size 1024";
        assert_eq!(changed(old, "llama-server -m m.gguf --port 8080 --ctx-size 2048"), ["--ctx-size"]);
        assert_eq!(changed(old, "llama-server -m m.gguf --rope-freq-base 1000 --port 8080 --ctx-size 1024"), ["--rope-freq-base"]);
        assert_eq!(changed(old, "llama-server -m m.gguf --port 8080"), ["--ctx-size"]);
        assert!(changed(old, old).is_empty());
    }

    #[test]
    fn equals_form_short_flags_switches_and_repeats() {
        assert_eq!(changed("vllm serve m --max-model-len=4096", "vllm serve m --max-model-len=8192"), ["--max-model-len"]);
        // `--x=1` and `--x 1` say the same.
        assert!(changed("p --x=1 -c 5", "p --x 1 -c 5").is_empty());
        assert_eq!(changed("p -c 2048 -np 1 -fa", "p -c 2048 -np 2"), ["-np", "-fa"]);
        assert_eq!(changed("p --verbose -c 1", "p -c 1 --verbose --no-mmap"), ["--no-mmap"]);
        assert_eq!(changed("p -ot a -ot b", "p -ot a"), ["-ot"]);
        assert_eq!(changed("p -ot a -ot b", "p -ot b -ot a"), ["-ot"]);
        // A negative number is a value, not a flag.
        assert_eq!(changed("p --temp -1 --seed 3", "p --temp -2 --seed 3"), ["--temp"]);
    }

    #[test]
    fn positional_arguments_by_their_order() {
        assert_eq!(changed("vllm serve Qwen/Qwen3-8B --port 8000", "vllm serve Qwen/Qwen3-14B --port 8000"), ["argv[2]"]);
        // Flags moved around positionals do not shift them.
        assert!(changed("vllm serve M --port 8000", "vllm --port 8000 serve M").is_empty());
        assert_eq!(changed("/usr/bin/llama-server -c 1", "/opt/llama-server -c 1"), ["argv[0]"]);
        assert_eq!(changed("python -m sglang.launch_server a", "python -m sglang.launch_server"), ["argv[3]"]);
        // After `--` everything is positional.
        assert_eq!(changed("p -- -x", "p -- -y"), ["argv[2]"]);
        assert_eq!(changed("p -a 1 x", "p -a 2 x y"), ["-a", "argv[4]"]);
    }
}
