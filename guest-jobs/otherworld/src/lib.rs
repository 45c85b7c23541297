//! Test fixture: a well-formed component built to a different world (it exports `greet`, not
//! `describe` and `run-step`). The host must refuse it as "not a leasehold job".

wit_bindgen::generate!({
    inline: r#"
        package other:greeter@1.0.0;

        world greeter {
            /// Says hello.
            export greet: func(name: string) -> string;
        }
    "#,
});

struct Greeter;

impl Guest for Greeter {
    fn greet(name: String) -> String {
        format!("hello, {name}")
    }
}

export!(Greeter);
