//! The server's life cycle over raw HTTP/1.1: it answers before the model is ready (503 with an
//! OpenAI-shaped error), then 200 once `serve_model` runs.

use muser_engine::{LoadOptions, Model};
use muser_server::{Server, ServerConfig};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};

/// One request on a fresh connection: (status, body).
fn http(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out[9..12].parse().unwrap();
    let body = out
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    (status, body)
}

#[test]
fn health_is_503_while_loading_then_200() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../models/muse-default.gguf"
    );
    let server = Server::start(ServerConfig {
        port: 0,
        parallel: 2,
        model_path: path.into(),
        ..Default::default()
    })
    .unwrap();
    let addr = server.addr();

    let (status, body) = http(addr, "GET", "/health", "");
    assert_eq!(status, 503, "{body}");
    assert!(body.contains(r#""code":"loading""#), "{body}");
    let (status, body) = http(addr, "POST", "/v1/completions", r#"{"prompt": "hi"}"#);
    assert_eq!(status, 503, "{body}");
    assert!(body.contains(r#""type":"unavailable_error""#), "{body}");
    // A known path with the wrong method, and an unknown path: OpenAI-shaped JSON errors.
    for (method, path, status, code) in [
        ("GET", "/v1/completions", 405, "method_not_allowed"),
        ("DELETE", "/health", 405, "method_not_allowed"),
        ("POST", "/v1/nothing", 404, "not_found"),
    ] {
        let (got, body) = http(addr, method, path, "");
        assert_eq!(got, status, "{method} {path}: {body}");
        let v: serde_json::Value = serde_json::from_str(&body).expect("a JSON error body");
        assert_eq!(v["error"]["code"], code, "{method} {path}: {body}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains(path),
            "{body}"
        );
    }

    std::thread::spawn(move || {
        let model = Model::load(
            path,
            &LoadOptions {
                threads: Some(1),
                ..Default::default()
            },
        )
        .unwrap();
        server.serve_model(model).unwrap();
    });
    // Bounded wait for the model to load (no timing is asserted).
    let mut ready = false;
    for _ in 0..600 {
        if http(addr, "GET", "/health", "").0 == 200 {
            ready = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(ready, "the server never became ready");
    let (status, body) = http(
        addr,
        "POST",
        "/v1/completions",
        r#"{"prompt": "Once upon a time", "max_tokens": 5, "temperature": 0}"#,
    );
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(r#""completion_tokens":5"#), "{body}");
}

#[test]
fn a_port_in_use_is_an_error() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let e = Server::start(ServerConfig {
        port,
        ..Default::default()
    })
    .err()
    .expect("a second server on the same port");
    assert!(e.to_string().contains(&port.to_string()), "{e}");
    assert!(Server::start(ServerConfig {
        port: 0,
        parallel: 0,
        ..Default::default()
    })
    .is_err());
}
