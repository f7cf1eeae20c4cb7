# The Elixir application of mallocinfo_elixir_SUITE: mallocinfo as a path
# dependency, written as its README tells Elixir users to write it.
defmodule MiElixirApp.MixProject do
  use Mix.Project

  def project do
    [
      app: :mi_elixir_app,
      version: "0.1.0",
      elixir: "~> 1.14",
      deps: [{:mallocinfo, path: "../mallocinfo", manager: :rebar3}],
      # OTP applications mallocinfo uses when they are there: xmerl for
      # heaps/0, inets for mallocinfo_http, and for the report's
      # instrument figures tools (OTP 25) or runtime_tools (OTP 26 on,
      # where instrument moved). In the release, loaded, not started.
      releases: [
        mi_elixir_app: [
          applications: [xmerl: :load, inets: :load, tools: :load, runtime_tools: :load]
        ]
      ]
    ]
  end

  def application, do: []
end
