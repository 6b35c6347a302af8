//! Reads a JSON Schema on stdin and prints the GBNF grammar (or the error).
use std::io::Read;

fn main() {
    let mut s = String::new();
    std::io::stdin().read_to_string(&mut s).expect("read stdin");
    let v: serde_json::Value = serde_json::from_str(&s).expect("stdin is not JSON");
    match muser_jsonschema::schema_to_gbnf(&v) {
        Ok(g) => print!("{g}"),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}
