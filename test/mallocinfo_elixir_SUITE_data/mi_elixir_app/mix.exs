# The Elixir application of mallocinfo_elixir_SUITE: mallocinfo as a path
# dependency, written as its README tells Elixir users to write it.
defmodule MiElixirApp.MixProject do
  use Mix.Project

  def project do
    [
      app: :mi_elixir_app,
      version: "0.1.0",
      elixir: "~> 1.14",
      deps: [{:mallocinfo, path: "../mallocinfo", manager: :rebar3}]
    ]
  end

  def application, do: []
end
