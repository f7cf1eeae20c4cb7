defmodule MiElixirApp.Leak do
  @moduledoc """
  Stubs of priv/mi_elixir_leak.so, a NIF that leaks on purpose from
  mi_elixir_leak_here/1, so the tracker's answer can be checked exactly.
  """
  @on_load :load_nif

  def load_nif do
    path = Path.join(:code.priv_dir(:mi_elixir_app), "mi_elixir_leak")
    :erlang.load_nif(String.to_charlist(path), 0)
  end

  def leak(_count, _size), do: :erlang.nif_error(:nif_not_loaded)
  def release, do: :erlang.nif_error(:nif_not_loaded)
end
