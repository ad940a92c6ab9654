//! The egress flags and the routing decision (pure).

use super::*;

fn parse(args: &[&str]) -> Result<Egress, EgressError> {
    #[derive(clap::Parser)]
    struct Flags {
        #[command(flatten)]
        egress: EgressArgs,
    }
    let flags =
        <Flags as clap::Parser>::try_parse_from(std::iter::once("x").chain(args.iter().copied()))
            .expect("flags parse");
    flags.egress.egress()
}

fn name(n: &str) -> EgressProxy {
    EgressProxy {
        name: Some(n.into()),
        direct: false,
    }
}

const DIRECT: EgressProxy = EgressProxy {
    name: None,
    direct: true,
};

#[test]
fn without_flags_everything_is_direct_and_names_are_refused() {
    let egress = parse(&[]).unwrap();
    assert_eq!(egress.route(None, "hooks.example.com"), Route::Direct);
    assert_eq!(
        egress.route(Some(&DIRECT), "hooks.example.com"),
        Route::Direct
    );
    assert!(matches!(
        egress.route(Some(&name("default")), "hooks.example.com"),
        Route::Refused(why) if why.contains("\"default\" is not a proxy this platform allows: it has no egress proxies")
    ));
}

#[test]
fn the_default_proxy_is_used_unless_no_proxy_or_the_endpoint_says_otherwise() {
    let egress = parse(&[
        "--egress-proxy",
        "http://squid.egress:3128",
        "--egress-proxy-named",
        "eu=http://10.1.2.3:8080, us=http://[fd00::1]",
        "--egress-no-proxy",
        "internal.example, .svc.cluster.local,10.0.0.0/8",
    ])
    .unwrap();
    let proxy = |route: Route<'_>| match route {
        Route::Proxy(p) => p.to_string(),
        other => format!("{other:?}"),
    };
    assert_eq!(
        proxy(egress.route(None, "hooks.example.com")),
        r#""default" (squid.egress:3128)"#
    );
    assert_eq!(
        proxy(egress.route(Some(&name("eu")), "hooks.example.com")),
        r#""eu" (10.1.2.3:8080)"#
    );
    assert_eq!(
        proxy(egress.route(Some(&name("us")), "a.test")),
        r#""us" ([fd00::1]:80)"#
    );
    for direct in [
        "internal.example",
        "api.internal.example",
        "a.b.svc.cluster.local",
        "10.9.8.7",
    ] {
        assert_eq!(egress.route(None, direct), Route::Direct, "{direct}");
    }
    for proxied in [
        "svc.cluster.local",
        "notinternal.example",
        "11.0.0.1",
        "[::1]",
    ] {
        assert!(
            matches!(egress.route(None, proxied), Route::Proxy(_)),
            "{proxied}"
        );
    }
    // An endpoint's named proxy applies even where no-proxy would not use the default.
    assert!(matches!(
        egress.route(Some(&name("default")), "10.9.8.7"),
        Route::Proxy(_)
    ));
    // What the operator reports for a name the platform did not configure.
    let unknown = egress.check(Some(&name("elsewhere"))).unwrap_err();
    assert!(
        unknown.contains(r#"spec.delivery.proxy.name "elsewhere" is not a proxy this platform allows (allowed: default, eu, us)"#),
        "{unknown}"
    );
    assert_eq!(egress.check(Some(&name("eu"))), Ok(()));
    assert_eq!(egress.check(None), Ok(()));
    // Direct only where the platform allows it.
    assert!(matches!(
        egress.route(Some(&DIRECT), "a.test"),
        Route::Refused(_)
    ));
    let open = parse(&["--egress-proxy", "http://p:1", "--egress-allow-direct"]).unwrap();
    assert_eq!(open.route(Some(&DIRECT), "a.test"), Route::Direct);
}

#[test]
fn proxy_urls_are_checked_and_never_carry_credentials() {
    for (flags, says) in [
        (vec!["--egress-proxy", "https://p:443"], "http://host:port"),
        (
            vec!["--egress-proxy", "http://user:s3cret@p:3128"],
            "credentials in the URL",
        ),
        (vec!["--egress-proxy", "http://p:3128/path"], "no path"),
        (vec!["--egress-proxy", "not a url"], "not a valid URL"),
        (vec!["--egress-proxy-named", "eu"], "NAME=http"),
        (vec!["--egress-proxy-named", "EU=http://p:1"], "lower-case"),
        (
            vec![
                "--egress-proxy",
                "http://p:1",
                "--egress-proxy-named",
                "default=http://q:1",
            ],
            "twice",
        ),
        (vec!["--egress-no-proxy", "bad host!"], "--egress-no-proxy"),
    ] {
        let error = parse(&flags).unwrap_err().to_string();
        assert!(error.contains(says), "{flags:?}: {error}");
        assert!(!error.contains("s3cret"), "{error}");
    }
}

#[test]
fn credentials_come_from_a_file_per_proxy_and_are_never_printed() {
    let dir = std::env::temp_dir().join(format!("herald-egress-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("default"), "herald:pa:ss\n").unwrap();
    let dir_flag = dir.to_str().unwrap();
    let egress = parse(&[
        "--egress-proxy",
        "http://p:3128",
        "--egress-proxy-named",
        "eu=http://q:3128",
        "--egress-proxy-credentials",
        dir_flag,
    ])
    .unwrap();
    let default = &egress.proxies["default"];
    assert_eq!(default.authorization(), Some("Basic aGVyYWxkOnBhOnNz"));
    assert_eq!(egress.proxies["eu"].authorization(), None);
    let printed = format!("{egress:?} {default}");
    assert!(
        !printed.contains("aGVyYWxk") && !printed.contains("pa:ss"),
        "{printed}"
    );
    assert!(printed.contains("with credentials"), "{printed}");
    std::fs::remove_dir_all(&dir).unwrap();
}
