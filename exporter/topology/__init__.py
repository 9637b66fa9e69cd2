"""The network topology tree shared by everyone: layers, domains, hops; parsers and writers."""
