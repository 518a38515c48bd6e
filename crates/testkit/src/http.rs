//! The HTTP clients behind [`Node`](crate::Node): a ureq agent for
//! well-formed requests, and a minimal raw HTTP/1.1 client for bodies no
//! well-behaved client would send (malformed JSON, invalid UTF-8, oversized
//! bodies), with its own response parser and chunked decoding.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::Duration;

use crate::{Resp, truncate};

/// Upper bound for a single HTTP exchange with a node.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(300);

/// An agent that returns 4xx/5xx as responses and never uses a proxy.
pub(crate) fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(REQUEST_TIMEOUT))
        .proxy(None)
        .build()
        .new_agent()
}

/// `POST url` with a JSON body and extra headers, to any server (a Spin
/// app in front of a node); 4xx/5xx are returned, a transport failure
/// panics.
pub fn post_json(url: &str, body: &serde_json::Value, headers: &[(&str, &str)]) -> Resp {
    let mut request = agent().post(url).header("content-type", "application/json");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request
        .send(serde_json::to_vec(body).expect("serialize request body"))
        .and_then(Resp::from_ureq)
        .unwrap_or_else(|e| panic!("POST {url} failed: {e}"))
}

/// `POST base + path` with arbitrary bytes through the raw client (see
/// [`raw_post`]), to any server on loopback: `base` is `http://HOST:PORT`.
pub fn post_raw_to(base: &str, path: &str, body: &[u8], content_type: &str) -> Resp {
    let addr: SocketAddr = base
        .trim_start_matches("http://")
        .parse()
        .unwrap_or_else(|e| panic!("{base} is not http://HOST:PORT: {e}"));
    raw_post(addr, path, body, content_type, REQUEST_TIMEOUT)
        .unwrap_or_else(|e| panic!("raw POST {base}{path} ({} bytes) failed: {e}", body.len()))
}

/// `POST path` with `body` over a fresh connection. Writes the body on one
/// thread while reading the response on another, so a server that answers
/// early (413 before reading a large body) and closes is still seen
/// answering, not as a write error.
pub(crate) fn raw_post(
    addr: SocketAddr,
    path: &str,
    body: &[u8],
    content_type: &str,
    timeout: Duration,
) -> std::io::Result<Resp> {
    let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(10))?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let mut writer = stream.try_clone()?;
    let mut request = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: {content_type}\r\n\
         Content-Length: {}\r\nAccept: application/json\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(body);
    let write_thread = std::thread::spawn(move || -> std::io::Result<()> {
        writer.write_all(&request)?;
        writer.flush()
    });

    let mut reader = stream;
    let mut raw = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    let read_result = loop {
        match reader.read(&mut buf) {
            Ok(0) => break Ok(()),
            Ok(n) => {
                raw.extend_from_slice(&buf[..n]);
                if parse_http_response(&raw, false).is_some() {
                    break Ok(());
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => break Err(e),
        }
    };
    // Unblocks the writer if the server stopped reading the body.
    let _ = reader.shutdown(Shutdown::Both);
    let write_result = write_thread.join();

    match parse_http_response(&raw, true) {
        Some(resp) => Ok(resp),
        None => {
            let why = match (read_result, write_result) {
                (Err(e), _) => format!("read: {e}"),
                (Ok(()), Ok(Err(e))) => format!("write: {e}"),
                _ => "connection closed".to_owned(),
            };
            Err(std::io::Error::other(format!(
                "no complete HTTP response ({why}); received {} bytes: {}",
                raw.len(),
                truncate(&String::from_utf8_lossy(&raw), 500)
            )))
        }
    }
}

/// Parse `raw` as an HTTP/1.1 response. Returns `None` while incomplete;
/// with `at_eof`, a body without length runs to the end of `raw`.
fn parse_http_response(raw: &[u8], at_eof: bool) -> Option<Resp> {
    let head_end = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&raw[..head_end]).into_owned();
    let rest = &raw[head_end + 4..];
    let mut lines = head.split("\r\n");
    let status: u16 = lines.next()?.split_whitespace().nth(1)?.parse().ok()?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let find = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    };
    let body =
        if find("transfer-encoding").is_some_and(|v| v.to_ascii_lowercase().contains("chunked")) {
            decode_chunked(rest)?
        } else if let Some(len) = find("content-length").and_then(|v| v.parse::<usize>().ok()) {
            if rest.len() < len {
                return None;
            }
            rest[..len].to_vec()
        } else if status == 204 || status == 304 || (100..200).contains(&status) {
            Vec::new()
        } else if at_eof {
            rest.to_vec()
        } else {
            return None;
        };
    Some(Resp {
        status,
        headers,
        body_text: String::from_utf8_lossy(&body).into_owned(),
    })
}

/// Decode a complete chunked body; `None` while the final chunk is missing.
fn decode_chunked(mut data: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = data.windows(2).position(|w| w == b"\r\n")?;
        let size_text = String::from_utf8_lossy(&data[..line_end]);
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        data = &data[line_end + 2..];
        if size == 0 {
            return Some(out);
        }
        if data.len() < size + 2 {
            return None;
        }
        out.extend_from_slice(&data[..size]);
        data = &data[size + 2..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_raw_http_responses() {
        let raw = b"HTTP/1.1 413 Payload Too Large\r\ncontent-type: application/json\r\n\
                    content-length: 13\r\n\r\n{\"error\":{}}\n";
        let resp = parse_http_response(raw, false).expect("complete");
        assert_eq!(resp.status, 413);
        assert_eq!(resp.header("Content-Type"), Some("application/json"));
        assert_eq!(resp.body_text, "{\"error\":{}}\n");
        assert!(parse_http_response(&raw[..raw.len() - 3], false).is_none());

        let chunked = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n\
                        4\r\nWiki\r\n5;ext=1\r\npedia\r\n0\r\n\r\n";
        assert_eq!(
            parse_http_response(chunked, false).unwrap().body_text,
            "Wikipedia"
        );
        assert!(parse_http_response(&chunked[..chunked.len() - 5], false).is_none());

        let until_eof = b"HTTP/1.1 400 Bad Request\r\nconnection: close\r\n\r\nbad";
        assert!(parse_http_response(until_eof, false).is_none());
        assert_eq!(
            parse_http_response(until_eof, true).unwrap().body_text,
            "bad"
        );
    }

    #[test]
    fn raw_client_sees_an_early_413() {
        // A server that answers before reading a large body, then closes.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut socket, _) = listener.accept().unwrap();
            let mut head = [0u8; 1024];
            let _ = socket.read(&mut head);
            let body =
                r#"{"error":{"message":"too large","type":"invalid_request_error","code":null}}"#;
            let response = format!(
                "HTTP/1.1 413 Payload Too Large\r\ncontent-type: application/json\r\n\
                 content-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            // One write, as an HTTP server does it (piecewise writes would sit
            // behind Nagle and be discarded by the reset below).
            socket.write_all(response.as_bytes()).unwrap();
            // Closing with unread data makes the kernel reset the connection.
        });
        let big = vec![b'a'; 10 * 1024 * 1024];
        let resp = raw_post(
            addr,
            "/v1/chat/completions",
            &big,
            "application/json",
            REQUEST_TIMEOUT,
        )
        .expect("the 413 is read even though the body was not");
        assert_eq!(resp.status, 413);
        assert!(resp.body_text.contains("too large"));
        server.join().unwrap();
    }
}
